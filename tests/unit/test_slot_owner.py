"""Host slots have one owner (issue 49): slots handed to a prefetch are its own until
`load_prefetched` or `Prefetch.cancel`, and every call naming them is refused naming the
prefetch before any byte moves; host slots never allocated are refused; a refused
`load_prefetched` leaves the prefetch usable; a cancel leaves no read landing after it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.l3.prefetch import Prefetch
from pipeline.jobs.contents import POISON, fill_random, first_mismatch, poison, snapshot

pytestmark = pytest.mark.usefixtures("one_rank")

PAGES = 4
WAIT_S = 120.0


@contextlib.contextmanager
def engine_on(tmp_path: Path, *overrides: str) -> Iterator[Engine]:
    """A one-rank CPU engine of tiny_mla on a file store in `tmp_path`."""
    base = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"]
    knobs = [
        f"storage.path={tmp_path}",
        "storage.io_threads=2",
        "storage.prefetch_policy=wait_complete",
    ]
    job = pipeline.compose([*base, *knobs, *overrides])
    engine = pipeline.create_engine(job)
    try:
        yield engine
    finally:
        engine.close()


def settle(engine: Engine) -> None:
    while engine.acks.pending:
        engine.poll()


def stored(engine: Engine) -> tuple[list[str], dict[int, torch.Tensor]]:
    """PAGES device pages backed up, written back and evicted from the host tier: (their
    keys, their bytes by unit)."""
    size, source = engine.sizing.slots_per_page, list(range(PAGES))
    fill_random(engine, source, 7)
    expected = snapshot(engine, source)
    host = engine.host_slots.alloc(PAGES * size)
    engine.backup(host, page_tokens(source, size)).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, host).wait()
    settle(engine)
    engine.host_slots.free(host)
    return keys, expected


@contextlib.contextmanager
def held_io(engine: Engine) -> Iterator[threading.Event]:
    """Every I/O thread of the engine's tier waits on the event this yields (set on exit), so
    reads started meanwhile queue behind it: a prefetch that stays in flight."""
    tier = engine.l3
    assert tier is not None
    gate = threading.Event()
    busy = [tier.io.submit(gate.wait, WAIT_S) for _ in range(tier.storage.io_threads)]
    try:
        yield gate
    finally:
        gate.set()
        for work in busy:
            work.result(timeout=WAIT_S)


def loaded_bit_exact(engine: Engine, prefetch: Prefetch, expected: dict, target: list[int]) -> str:
    """Load `prefetch` into `target` (poisoned first); '' when every page is bit-exact."""
    size = engine.sizing.slots_per_page
    poison(engine, target)
    loaded = engine.load_prefetched(prefetch, page_tokens(target, size))
    assert loaded.hits == PAGES and loaded.handle is not None
    loaded.handle.done().wait()
    settle(engine)
    return first_mismatch(engine, target, expected)


def refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(ValueError) as refused:
        call()
    return str(refused.value)


def test_every_call_naming_a_prefetchs_slots_is_refused_naming_it(tmp_path: Path) -> None:
    with engine_on(tmp_path) as engine:
        keys, expected = stored(engine)
        slots, size = engine.host_slots, engine.sizing.slots_per_page
        fresh = slots.alloc(PAGES * size)
        device = page_tokens(list(range(8, 8 + PAGES)), size)
        with held_io(engine):
            prefetch = engine.prefetch(keys, fresh)
            free = slots.num_free
            calls = {
                "free": lambda: slots.free(fresh),
                "free one page": lambda: slots.free(fresh[size : 2 * size]),
                "reuse": lambda: slots.reuse(fresh),
                "backup": lambda: engine.backup(fresh, device),
                "load": lambda: engine.load(fresh, device),
                "write_back": lambda: engine.write_back(keys, fresh),
                "load_from_l3": lambda: engine.load_from_l3(keys, fresh, device),
                "prefetch": lambda: engine.prefetch(keys, fresh),
            }
            said = {name: refusal(call) for name, call in calls.items()}
            assert slots.num_free == free
        for name, message in said.items():
            assert f"{prefetch.name} holds" in message, name
            assert "Engine.load_prefetched" in message and "Prefetch.cancel" in message, name
        assert prefetch.name == f"a prefetch of {PAGES} pages (keys {keys[0]}..{keys[-1]})"
        assert loaded_bit_exact(engine, prefetch, expected, [8, 9, 10, 11]) == ""
        slots.free(fresh)  # the loaded pages are the caller's again


def test_cancel_stops_every_read_and_gives_the_slots_back(tmp_path: Path) -> None:
    with engine_on(tmp_path) as engine:
        keys, expected = stored(engine)
        slots, size = engine.host_slots, engine.sizing.slots_per_page
        free = slots.num_free
        fresh = slots.alloc(PAGES * size)
        pages = (fresh[::size] // size).tolist()
        for unit in engine.host_pool.owned:
            engine.host_pool.layer(unit).view(torch.uint8)[pages] = POISON
        with held_io(engine):  # no read has started when the cancel comes
            prefetch = engine.prefetch(keys, fresh)
            prefetch.cancel()
            assert slots.num_free == free and prefetch.ready() == 0
        untouched = [
            bool((engine.host_pool.layer(u).view(torch.uint8)[pages] == POISON).all())
            for u in engine.host_pool.owned
        ]
        assert all(untouched)  # the reads queued behind the held threads never ran
        prefetch.cancel()  # a second cancel is a no-op
        assert slots.num_free == free
        assert "was cancelled already" in refusal(
            lambda: engine.load_prefetched(prefetch, page_tokens([8, 9, 10, 11], size))
        )
        again = slots.alloc(PAGES * size)
        assert again.tolist() == fresh.tolist()  # the same slots, free again
        assert (
            loaded_bit_exact(engine, engine.prefetch(keys, again), expected, [8, 9, 10, 11]) == ""
        )


def test_a_refused_load_prefetched_leaves_the_prefetch_usable(tmp_path: Path) -> None:
    with engine_on(tmp_path) as engine:
        keys, expected = stored(engine)
        slots, size = engine.host_slots, engine.sizing.slots_per_page
        fresh = slots.alloc(PAGES * size)
        prefetch = engine.prefetch(keys, fresh)
        top = engine.sizing.device_pages
        bad = {
            "out of range": page_tokens([top - 1, top, 2, 3], size),
            "too few": page_tokens([8, 9], size),
            "a page twice": page_tokens([8, 9, 8, 10], size),
            "sparse": page_tokens([8, 9, 10, 11], size).to_sparse(),
            "float": page_tokens([8, 9, 10, 11], size).float(),
        }
        target = [8, 9, 10, 11]
        poison(engine, target)
        for name, device in bad.items():
            message = refusal(lambda device=device: engine.load_prefetched(prefetch, device))
            assert "device_indices" in message, (name, message)
        assert "holds" in refusal(lambda: slots.free(fresh))  # still the prefetch's
        assert all(bool((t == POISON).all()) for t in snapshot(engine, target).values())
        assert loaded_bit_exact(engine, prefetch, expected, target) == ""


def test_host_slots_never_allocated_are_refused_by_every_call(tmp_path: Path) -> None:
    with engine_on(tmp_path) as engine:
        keys, _ = stored(engine)  # every host slot is free again
        slots, size = engine.host_slots, engine.sizing.slots_per_page
        loose = page_tokens([20, 21, 22, 23], size)
        device = page_tokens([8, 9, 10, 11], size)
        calls = {
            "prefetch": lambda: engine.prefetch(keys, loose),
            "load_from_l3": lambda: engine.load_from_l3(keys, loose, device),
            "write_back": lambda: engine.write_back(keys, loose),
            "load": lambda: engine.load(loose, device),
            "backup": lambda: engine.backup(loose, device),
            "free": lambda: slots.free(loose),
            "reuse": lambda: slots.reuse(loose),
        }
        free = slots.num_free
        for name, call in calls.items():
            message = refusal(call)
            assert "names host pages that are not allocated" in message, (name, message)
            assert "[20, 21, 22, 23]" in message, (name, message)
        assert slots.num_free == free
