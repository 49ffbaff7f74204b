"""A bounded file store: real files in a real folder, several processes sharing it. Writing
3x the capacity leaves the folder under it with the most recently used objects kept, a
restarted store learns what the folder holds, and two processes writing, reading and evicting
one folder at once never read a torn object and leave the ledger exact."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import re
import struct
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
import torch
from hydra import initialize_config_module

import pipeline
from pipeline.config.compose import Session
from pipeline.config.sources import SHIPPED
from pipeline.core.checks import ConfigError
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import FileStore, open_store
from pipeline.engine.l3.stores.capacity import CapacityFull
from pipeline.engine.l3.stores.ledger import LEDGER
from pipeline.engine.l3.stores.owned import walk

OBJECT_BYTES = 4096
SPACE = "v3-bf16-p4-0123456789abcdef"


def blob(name: str, size: int = OBJECT_BYTES) -> bytes:
    """A header that names the object (the store evicts only what proves to be its own),
    then bytes drawn from its name: any reader can tell a whole one from a torn one."""
    ns, nm = SPACE.encode(), name.encode()
    head = struct.pack("<5sHHHBIQ16s", b"HCPL3", 3, len(ns), len(nm), 0, 0, 0, bytes(16))
    seed = hashlib.sha256(name.encode()).digest()
    return (head + ns + nm + seed * (size // len(seed) + 1))[:size]


def name_of(i: int, writer: str = "w") -> str:
    key = hashlib.sha256(f"{writer}{i}".encode()).hexdigest()[:32]
    return f"{SPACE}/{key[:2]}/{key}"


def held_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name != LEDGER)


def read_back(store: FileStore, name: str, size: int = OBJECT_BYTES) -> bytes | None:
    into = bytearray(size)
    return bytes(into) if store.read(name, size, [(0, [memoryview(into)])]) else None


def test_writing_three_times_the_capacity_keeps_the_most_recently_used(tmp_path: Path) -> None:
    capacity = 40 * OBJECT_BYTES
    store = FileStore(str(tmp_path), capacity_bytes=capacity, evict_to=0.5)
    hot = [name_of(i) for i in range(4)]  # read after every write: always recently used
    for name in hot:
        store.put(name, [blob(name)])
    written = [name_of(i) for i in range(4, 124)]  # 3x the capacity
    for name in written:
        store.put(name, [blob(name)])
        assert held_bytes(tmp_path) <= capacity
        assert all(read_back(store, h) == blob(h) for h in hot)
    assert all(read_back(store, name) == blob(name) for name in written[-10:])
    assert [read_back(store, name) for name in written[:60]] == [None] * 60  # evicted: misses
    stats = store.stats()
    kept = held_bytes(tmp_path) // OBJECT_BYTES
    assert (stats["objects"], stats["bytes"]) == (kept, kept * OBJECT_BYTES)
    assert (stats["evictions"], stats["evicted_bytes"]) == (124 - kept, (124 - kept) * OBJECT_BYTES)
    assert stats["writes"] == 124 and stats["misses"] == 60
    store.close()


def test_a_batch_past_the_capacity_makes_room_at_once_and_keeps_its_own(tmp_path: Path) -> None:
    """`put_many` (a write-back's native batch) past the capacity: the least recently used
    objects go until the folder holds at most `evict_to` of it with the batch, never one of
    the batch; a batch that cannot fit beside what it must keep is CapacityFull and leaves
    no temporary file."""
    store = FileStore(str(tmp_path), capacity_bytes=10 * OBJECT_BYTES, evict_to=0.5, threads=2)
    try:
        old = [name_of(i) for i in range(7)]
        store.put_many([(n, [blob(n)]) for n in old])
        new = [name_of(i) for i in range(7, 11)]
        store.exists(new)  # as a write-back asks first: these are kept
        store.put_many([(n, [blob(n)]) for n in new])
        assert all(read_back(store, n) == blob(n) for n in new)
        kept = sum(store.exists(old))
        assert held_bytes(tmp_path) == (4 + kept) * OBJECT_BYTES <= 5 * OBJECT_BYTES
        assert store.stats()["objects"] == 4 + kept and store.stats()["evictions"] == 7 - kept
        huge = [name_of(i) for i in range(11, 22)]
        store.exists(huge)
        with pytest.raises(CapacityFull):
            store.put_many([(n, [blob(n)]) for n in huge])
        assert not [p for p in tmp_path.rglob(".tmp-*")]
    finally:
        store.close()


@pytest.mark.usefixtures("one_rank")
def test_an_engine_writing_back_three_times_the_capacity(tmp_path: Path) -> None:
    """Through a real engine: the folder stays under the bound, the prefix loaded from L3
    after every write-back (a read is a use) and the newest survive, the oldest are misses."""
    store = ["storage=file", f"storage.path={tmp_path}", "storage.capacity_bytes=20KB"]
    bound = [*store, "storage.evict_to=0.75"]  # about 14 objects of 1430 B: 10 prefixes of 21
    job = pipeline.compose(["topology=tp1", "workload.num_tokens=32", *bound])
    engine = pipeline.create_engine(job)
    try:
        size = engine.sizing.slots_per_page
        prefixes = [engine.l3_keys(list(range(p * 1000, p * 1000 + 2 * size))) for p in range(21)]
        for keys in prefixes:
            host = engine.host_slots.alloc(2 * size)
            engine.backup(host, torch.arange(2 * size)).wait()
            engine.write_back(keys, host).wait()
            settle(engine)
            engine.host_slots.free(host)
            assert held_bytes(tmp_path) <= 20_000
            again = engine.host_slots.alloc(2 * size)
            hot = engine.load_from_l3(prefixes[0], again, torch.arange(2 * size, 4 * size))
            assert hot.hits == 2
            settle(engine)
            engine.host_slots.free(again)
        found = [engine.lookup(keys) for keys in prefixes]
    finally:
        engine.close()
    assert found[0] == 2 and found[-3:] == [2, 2, 2] and found[1:4] == [0, 0, 0]
    one = next(f for f in tmp_path.rglob("*") if f.is_file() and f.name != LEDGER).stat().st_size
    assert 2 * found.count(2) * one <= held_bytes(tmp_path) <= 20_000


def settle(engine: pipeline.Engine) -> None:
    while engine.acks.pending:
        engine.poll()


def test_a_new_store_learns_what_the_folder_holds(tmp_path: Path) -> None:
    unbounded = FileStore(str(tmp_path))  # an earlier job that had no bound
    for i in range(30):
        unbounded.put(name_of(i), [blob(name_of(i))])
    assert unbounded.stats()["bytes"] is None
    unbounded.close()
    store = FileStore(str(tmp_path), capacity_bytes=20 * OBJECT_BYTES, evict_to=0.5)
    assert store.stats()["objects"] == 30 and store.stats()["bytes"] == 30 * OBJECT_BYTES
    new = name_of(99, "new")
    store.put(new, [blob(new)])
    assert held_bytes(tmp_path) <= 10 * OBJECT_BYTES
    assert read_back(store, new) == blob(new)
    assert store.stats()["evictions"] == 30 - 9
    store.close()


def test_an_eviction_removes_what_a_crashed_writer_left(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path), capacity_bytes=4 * OBJECT_BYTES, evict_to=0.5)
    first = name_of(0, "a")
    store.put(first, [blob(first)])
    prefix = (tmp_path / first).parent
    left, writing = prefix / ".tmp-0123456789abcdef", prefix / ".tmp-456789abcdef0123"
    left.write_bytes(b"half an object")
    writing.write_bytes(b"a write in flight")
    two_hours_ago = time.time_ns() - 2 * 3600 * 10**9
    os.utime(left, ns=(two_hours_ago, two_hours_ago))
    for i in range(5):  # past the capacity: an eviction pass
        store.put(name_of(i), [blob(name_of(i))])
    assert (store.stats()["evictions"] or 0) > 0
    assert not left.exists() and writing.read_bytes() == b"a write in flight"
    store.close()


def test_a_removed_object_leaves_the_ledger(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path), capacity_bytes=1 << 20)
    a, b = name_of(0, "a"), name_of(0, "b")
    store.put(a, [blob(a)])
    store.put(b, [blob(b)])
    store.remove([a, name_of(0, "never")])
    assert (store.stats()["objects"], store.stats()["bytes"]) == (1, OBJECT_BYTES)
    store.close()


def writer(root: str, writer_name: str, capacity: int, start: Barrier, results: Queue) -> None:
    """Write objects to a bounded store that another process writes at the same time,
    reading back the other's recent objects (each whole, or a miss); then what it evicted."""
    store = FileStore(root, capacity_bytes=capacity, evict_to=0.8)
    other = "b" if writer_name == "a" else "a"
    torn = []
    start.wait(timeout=60)
    for i in range(ROUNDS):
        name = name_of(i, writer_name)
        store.put(name, [blob(name)])
        for theirs in (name_of(j, other) for j in range(max(i - 4, 0), i + 1)):
            if read_back(store, theirs) not in (None, blob(theirs)):
                torn.append(theirs)
    results.put((writer_name, torn, store.stats()["evictions"]))
    store.close()


ROUNDS = 150


def test_two_processes_writing_and_evicting_one_folder(tmp_path: Path) -> None:
    """Every object written is in the folder or was evicted by one of the two (nothing
    lost, nothing counted twice); every read was whole or a miss; the bound held."""
    capacity = 24 * OBJECT_BYTES
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    writers = [
        context.Process(target=writer, args=(str(tmp_path), w, capacity, start, results))
        for w in "ab"
    ]
    for process in writers:
        process.start()
    reports = sorted(results.get(timeout=120) for _ in writers)
    for process in writers:
        process.join(timeout=60)
    assert [(name, torn) for name, torn, _ in reports] == [("a", []), ("b", [])]
    store = FileStore(str(tmp_path), capacity_bytes=capacity)
    found = list(walk(store.beneath))
    assert len(found) + sum(evicted for _, _, evicted in reports) == 2 * ROUNDS
    assert held_bytes(tmp_path) <= capacity
    assert len(found) >= int(0.8 * 24) - 1  # an eviction removes no more than it must
    assert store.stats()["bytes"] == sum(s.size for s in found) == held_bytes(tmp_path)
    assert not list(tmp_path.rglob(".tmp-*"))  # every write landed whole
    store.close()


def test_a_planted_ledger_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_bytes(b"")
    (tmp_path / LEDGER).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=re.escape(f"storage.path={tmp_path}: {LEDGER}")):
        FileStore(str(tmp_path), capacity_bytes=1 << 20)
    (tmp_path / LEDGER).unlink()
    os.mkfifo(tmp_path / LEDGER)
    with pytest.raises(ValueError, match=re.escape(f"storage.path={tmp_path}: {LEDGER}")):
        FileStore(str(tmp_path), capacity_bytes=1 << 20)


def test_a_capacity_below_one_object_is_refused(tmp_path: Path) -> None:
    config = StorageConfig(kind=StorageKind.file, path=str(tmp_path), capacity_bytes="64KiB")
    message = r"storage.capacity_bytes=64KiB: one write-back of 1 objects of up to 1048576 B"
    with pytest.raises(ValueError, match=message):
        open_store(config, largest_object=1 << 20)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["storage=file", "storage.capacity_bytes=lots"], "storage.capacity_bytes='lots'"),
        (["storage=file", "storage.capacity_bytes=0"], "storage.capacity_bytes='0'"),
        (["storage=file", "storage.evict_to=0"], "storage.evict_to=0.0: a fraction"),
        (["storage=file", "storage.evict_to=1.5"], "storage.evict_to=1.5: a fraction"),
        (["storage=mooncake", "storage.capacity_bytes=1GiB"], "master evicts on its own"),
    ],
)
def test_capacity_knobs_out_of_range_are_refused_naming_the_key(
    overrides: list[str], message: str
) -> None:
    with (
        initialize_config_module(config_module=SHIPPED, version_base="1.3"),
        pytest.raises(ConfigError, match=re.escape(message)),
    ):
        Session.compose(overrides).job()


def test_a_capacity_reads_as_bytes() -> None:
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        job = Session.compose(["storage=file", "storage.capacity_bytes=64GiB"]).job()
    assert job.storage.capacity == 64 << 30 and job.storage.evict_to == 0.9


def test_a_capacity_below_one_write_back_is_a_config_error_in_the_parent() -> None:
    """Refused by `compose` (exit 2, before a rank starts), naming the key and its least value:
    the workload's write-back must fit whole, or it would evict its own prefix's head."""
    with pytest.raises(ConfigError) as refused:
        pipeline.compose(["storage=file", "storage.capacity_bytes=1KiB"])
    ((key, message),) = [(p.key, p.message) for p in refused.value.problems]
    assert key == "storage.capacity_bytes"
    assert "one write-back of 64 objects" in message, message
    assert message.endswith("raise it to at least 108658 B"), message
