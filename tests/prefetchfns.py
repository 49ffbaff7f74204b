"""Rank functions for the prefetch tests: pages written back to L3, then prefetched into free
host slots while one rank's I/O threads are held busy (a slow reader, really slow: its reads
queue behind work that does not end until the test says), and loaded under a policy."""

from __future__ import annotations

import threading
from typing import Any

import torch.distributed as dist

from pipeline.config.job import Job
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.jobs.contents import POISON, fill_random, first_mismatch, poison, snapshot
from pipeline.jobs.run import forward

PAGES = 8
WAIT_S = 120.0
"""The bound on every wait here (a wedged rank fails the test instead of hanging it)."""


def prefetched(
    cases: list[tuple[Job, int, str]], rank: int, world_size: int, local_rank: int
) -> list[dict]:
    """Per case, on an engine of its own (one launch runs them all): write back 8 pages and
    evict them; then `slow` (a rank) holds its I/O threads busy, prefetch them into fresh host
    slots, and load them under the job's policy. `release`: 'timer' frees the slow rank's
    threads 0.5 s after the prefetch started, 'after' only once the load agreed, 'ready' frees
    them at once and waits (bounded) until every rank read every page."""
    said = []
    for job, slow, release in cases:
        engine = open_engine(job.recipe(), local_rank)
        try:
            said.append(_prefetched(engine, rank == slow, release))
        finally:
            engine.close()
    return said


def _prefetched(engine: Engine, slow: bool, release: str) -> dict[str, Any]:
    size, tier = engine.sizing.slots_per_page, engine.l3
    assert tier is not None
    source = list(range(PAGES))
    fill_random(engine, source, 5 + engine.runtime.replica_group[0])
    expected = snapshot(engine, source)
    host = engine.host_slots.alloc(PAGES * size)
    engine.backup(host, page_tokens(source, size)).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, host).wait()
    while engine.acks.pending:
        engine.poll()
    engine.host_slots.free(host)  # evicted from the host tier: only L3 has them now
    free_before = engine.host_slots.num_free
    gate = threading.Event()
    if slow:  # every I/O thread waits on the gate, so this rank's reads queue behind it
        busy = [tier.io.submit(gate.wait, WAIT_S) for _ in range(tier.storage.io_threads)]
    found = engine.lookup(keys)
    fresh = engine.host_slots.alloc(PAGES * size)
    prefetch = engine.prefetch(keys, fresh)
    if release == "timer":
        threading.Timer(0.5, gate.set).start()
    if release == "ready":  # nobody is held back: every rank reads every page first
        gate.set()
        _until_everyone_ready(prefetch, PAGES)
    target = [p + PAGES for p in source]
    poison(engine, target)
    loaded = engine.load_prefetched(prefetch, page_tokens(target, size))
    gate.set()
    if slow:
        for work in busy:
            work.result(timeout=WAIT_S)
    hits = loaded.hits
    if loaded.handle is not None:
        forward(engine, loaded.handle)
        loaded.handle.done(engine.runtime.forward_stream).wait()
    while engine.acks.pending:
        engine.poll()
    rest = snapshot(engine, target[hits:]) if hits < PAGES else {}
    return {
        "found": found,
        "hits": hits,
        "ready_after": prefetch.ready(),
        "loaded": first_mismatch(engine, target[:hits], {u: e[:hits] for u, e in expected.items()})
        if hits
        else "",
        "rest_untouched": all(bool((t == POISON).all()) for t in rest.values()),
        "slots_back": engine.host_slots.num_free - (free_before - hits * size),
        "stats": engine.stats(),
    }


def _until_everyone_ready(prefetch: Any, pages: int) -> None:
    """Wait (bounded) until this rank read every page, then for every other rank to. A rank
    whose roles read nothing (single_source's non-readers) has nothing to wait for: it would
    only run into the bound."""
    done = threading.Event()
    deadline = threading.Timer(WAIT_S, done.set)
    deadline.start()
    reads = bool(prefetch.job.reads)
    while reads and prefetch.ready() < pages and not done.is_set():
        done.wait(0.01)
    deadline.cancel()
    dist.barrier()


def refused_then_loaded(job: Job, rank: int, world_size: int, local_rank: int) -> dict:
    """Prefetch 8 written-back pages; rank 1 alone names device slots out of range in a
    load_prefetched (every rank must refuse it, before a byte moves), then both load them
    right; then a second prefetch, whose slots no rank may free, cancelled on every rank."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        return _refused_then_loaded(engine, rank)
    finally:
        engine.close()


def _refused_then_loaded(engine: Engine, rank: int) -> dict[str, Any]:
    size, slots = engine.sizing.slots_per_page, engine.host_slots
    source, target = list(range(PAGES)), [p + PAGES for p in range(PAGES)]
    fill_random(engine, source, 5 + engine.runtime.replica_group[0])
    expected = snapshot(engine, source)
    host = slots.alloc(PAGES * size)
    engine.backup(host, page_tokens(source, size)).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, host).wait()
    while engine.acks.pending:
        engine.poll()
    slots.free(host)
    prefetch = engine.prefetch(keys, slots.alloc(PAGES * size))
    poison(engine, target)
    top = engine.sizing.device_pages
    bad = page_tokens([top - 1 - p for p in range(PAGES - 1)] + [top], size)
    try:
        engine.load_prefetched(prefetch, bad if rank == 1 else page_tokens(target, size))
        refused = ""
    except ValueError as e:
        refused = str(e)
    untouched = all(bool((t == POISON).all()) for t in snapshot(engine, target).values())
    loaded = engine.load_prefetched(prefetch, page_tokens(target, size))
    if loaded.handle is not None:
        forward(engine, loaded.handle)
        loaded.handle.done(engine.runtime.forward_stream).wait()
    while engine.acks.pending:
        engine.poll()
    second = engine.prefetch(keys, fresh := slots.alloc(PAGES * size))
    try:
        slots.free(fresh)
        freed = ""
    except ValueError as e:
        freed = str(e)
    second.cancel()
    return {
        "refused": refused,
        "untouched": untouched,
        "hits": loaded.hits,
        "loaded": first_mismatch(engine, target, expected),
        "freed": freed,
        "digest": engine.state_digest(),
    }
