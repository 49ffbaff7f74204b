"""Every wait on the Mooncake master is bounded by runtime.timeout_s: with the master stopped
(SIGSTOP), a lookup and a load are misses and a write-back fails, each saying which master did
not answer within the bound (the client alone waits 30 s a call, and names nothing); once the
master answers again, the store works again. A real master on loopback, started by the test."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

import pipeline
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.factory import engine_on
from pipeline.engine.l3.stores import MooncakeStore, open_store
from pipeline.jobs.l3_store import concrete

pytestmark = pytest.mark.mooncake

TIMEOUT_S = 2
TINY = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "workload.num_tokens=16"]
PATIENCE_S = 120.0
"""How long the test waits for the master to answer again (not a bound it checks)."""


@pytest.fixture
def master(caplog: pytest.LogCaptureFixture) -> Iterator[tuple[StorageConfig, int]]:
    """A master on loopback for the test: its storage config and its pid."""
    caplog.set_level(logging.INFO, logger="hicache-pipeline")
    storage = StorageConfig(kind=StorageKind.mooncake, segment_bytes=64 << 20)
    with concrete(storage) as running:
        (pid,) = re.findall(r"mooncake_master \(pid (\d+)\)", caplog.text)
        yield running, int(pid)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The master stopped for the block: SIGSTOP is delivered asynchronously, so wait until
    each of its threads is seen stopped (state T) before the block asks it anything."""
    os.kill(pid, signal.SIGSTOP)
    try:
        assert eventually(lambda: all(state == "T" for state in thread_states(pid)))
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def thread_states(pid: int) -> list[str]:
    """The scheduler state of each of the process's threads (from /proc)."""
    tasks = f"/proc/{pid}/task"
    states = []
    for task in os.listdir(tasks):
        with open(f"{tasks}/{task}/stat") as stat:
            states.append(stat.read().rpartition(")")[2].split()[0])
    return states


def silent(storage: StorageConfig) -> str:
    return (
        f"the Mooncake master at {storage.master} did not answer within "
        f"runtime.timeout_s={TIMEOUT_S} s"
    )


def eventually(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_a_stopped_master_makes_reads_misses_and_writes_errors_naming_it(
    master: tuple[StorageConfig, int], caplog: pytest.LogCaptureFixture
) -> None:
    storage, pid = master
    store = open_store(storage, 1 << 20, timeout_s=TIMEOUT_S)
    assert isinstance(store, MooncakeStore)
    pool = np.zeros(4 * 4096, dtype=np.uint8)
    store.register([pool.data])
    try:
        parts = [memoryview(bytes([i]) * 4096) for i in range(4)]
        store.put("ns/ab/key", parts)
        into = [memoryview(bytearray(4096)) for _ in range(4)]
        ranged = [(4096, [pool.data[:4096]])]  # one unit, straight into registered memory
        said = silent(storage)
        with stopped(pid):
            assert store.exists(["ns/ab/key"]) == [False]  # what a lookup asks
            assert f"{said}: reads are misses and writes fail until it answers" in caplog.text
            assert not store.read("ns/ab/key", 4 * 4096, [(0, into)])
            assert store.get("ns/ab/key") is None
            reader = store.parts_reader()
            assert reader.read_parts([("ns/ab/key", 4 * 4096, ranged, lambda _: True)]) == 0
            reader.close()
            with pytest.raises(RuntimeError, match=re.escape(said)):
                store.put("ns/ab/other", parts)
            with pytest.raises(RuntimeError, match=re.escape(said)):
                store.remove(["ns/ab/key"])
        assert eventually(lambda: store.exists(["ns/ab/key"]) == [True])  # tried again
        assert store.read("ns/ab/key", 4 * 4096, [(0, into)])
        assert b"".join(into) == b"".join(parts)
    finally:
        store.unregister([pool.data])
        store.close()


def test_a_lookup_a_prefetched_load_and_a_write_back_on_a_stopped_master_name_it(
    one_rank: None, master: tuple[StorageConfig, int], caplog: pytest.LogCaptureFixture
) -> None:
    storage, pid = master
    job = pipeline.compose(
        [
            *TINY,
            "storage=mooncake",
            f"storage.master={storage.master}",
            f"storage.metadata_server={storage.metadata_server}",
            f"runtime.timeout_s={TIMEOUT_S}",
        ]
    )
    store = open_store(job.storage, 1 << 20, timeout_s=job.runtime.timeout_s)
    recipe = job.recipe()
    engine = engine_on(recipe, recipe.start_runtime(0), store=store)
    try:
        page = engine.sizing.slots_per_page
        host = engine.host_slots.alloc(4 * page)
        engine.backup(host, torch.arange(0, 4 * page)).wait()
        keys = engine.l3_keys(list(range(4 * page)))
        engine.write_back(keys, host).wait()
        engine.host_slots.free(host)
        said = silent(storage)
        with stopped(pid):
            assert engine.lookup(keys) == 0
            assert said in caplog.text
            into = engine.host_slots.alloc(4 * page)
            prefetch = engine.prefetch(keys, into)
            loaded = engine.load_prefetched(prefetch, torch.arange(4 * page, 8 * page))
            assert loaded.hits == 0
            backed = engine.host_slots.alloc(4 * page)
            engine.backup(backed, torch.arange(0, 4 * page)).wait()
            written = engine.write_back(engine.l3_keys(list(range(1, 4 * page + 1))), backed)
            with pytest.raises(RuntimeError, match=re.escape(said)):
                written.wait()
        assert eventually(lambda: engine.lookup(keys) == 4)
    finally:
        engine.close()
        store.close()
