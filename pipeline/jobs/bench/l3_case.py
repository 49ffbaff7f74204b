"""One case of `bench bench=l3` on one rank: fill, back up, write back and evict a prefix, the
machine's limits on its objects, then each timed load from L3, checked bit-exact."""

from __future__ import annotations

import time
from typing import Any

import torch

from pipeline.core.slots import page_tokens
from pipeline.core.storage import StorageConfig
from pipeline.engine.engine import Engine
from pipeline.engine.l3.load import streamed_layers
from pipeline.engine.l3.stores import FileStore, MooncakeStore
from pipeline.engine.l3.tier import L3Tier
from pipeline.jobs.bench.limits import file_limits, mooncake_limits
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.contents import fill_random, first_mismatch, poison_host, snapshot


def measure_l3_case(
    timer: Timer, engine: Engine, case: dict, storage: StorageConfig
) -> dict[str, Any]:
    """Back up, write back and evict one prefix; measure the limits on its objects (the
    writer rank; the others wait); then time loading it back from L3."""
    tier = engine.l3
    assert tier is not None, "an L3 case has a store"
    n = case["tokens"] // engine.sizing.slots_per_page
    target = list(range(n, 2 * n))
    keys, expected, write_back_s = _stored_prefix(timer, engine, n)
    limits = limits_of(tier, keys, timer, storage) if tier.rank == tier.roles.writer else {}
    read_before = engine.trace.bytes.get(("l3_read", ""), 0)
    outcome = _timed_loads(timer, engine, keys, target, cold=case["cache"] == "cold")
    runs = timer.bench.warmup + timer.bench.repeats
    exact = not first_mismatch(engine, target, expected)
    timer.line_up()
    if tier.rank == tier.roles.writer:  # the next case starts from an empty store
        tier.store.remove([tier.name(k) for k in keys])
    return {
        "write_back_s": write_back_s,
        "load_s": outcome["load_s"][timer.bench.warmup :],
        "fetch_s": outcome["fetch_s"][timer.bench.warmup :],
        "hits": min(outcome["hits"]),
        "fallbacks": outcome["fallbacks"],
        "l3_read_bytes_per_load": (engine.trace.bytes.get(("l3_read", ""), 0) - read_before)
        // runs,
        "bit_exact": exact and min(outcome["hits"]) == n,
        "limits": limits,
        "window_pages": tier.window_pages,
        "stream_layers": streamed_layers(engine, tier, n),  # as the loads ran
    }


def _timed_loads(
    timer: Timer, engine: Engine, keys: list[str], target: list[int], *, cold: bool
) -> dict[str, Any]:
    """Warm-up and timed loads of `keys` from L3 into `target` (cold: the writer asks the OS
    to drop the objects first); each load's seconds, hits and fallbacks."""
    tier = engine.l3
    assert tier is not None
    size, n = engine.sizing.slots_per_page, len(target)
    outcome: dict[str, Any] = {"hits": [], "fallbacks": 0, "load_s": [], "fetch_s": []}
    for _ in range(timer.bench.warmup + timer.bench.repeats):
        fresh = engine.host_allocator.alloc(n)
        if cold and tier.rank == tier.roles.writer and isinstance(tier.store, FileStore):
            tier.store.forget_cached([tier.name(k) for k in keys])
        timer.line_up()
        began = time.perf_counter()
        engine.lookup(keys)
        loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens(target, size))
        outcome["fetch_s"].append(time.perf_counter() - began)  # lookup, reads, loads issued
        if loaded.handle is not None:
            loaded.handle.done(engine.runtime.forward_stream).wait()
        outcome["load_s"].append(time.perf_counter() - began)
        outcome["hits"].append(loaded.hits)
        outcome["fallbacks"] += loaded.fallback
        _drain(engine)
        engine.host_allocator.free(fresh)
    return outcome


def _stored_prefix(
    timer: Timer, engine: Engine, n: int
) -> tuple[list[str], dict[int, torch.Tensor], float]:
    """Fill `n` device pages, back them up, write them back and evict them from the host
    tier: (their keys, their bytes, the best write-back's seconds: each is timed from an
    empty store, as often as each limit is, and the best of each is compared)."""
    size = engine.sizing.slots_per_page
    source = list(range(n))
    fill_random(engine, source, n * size + engine.runtime.replica_group[0])
    expected = snapshot(engine, source)
    host = engine.host_allocator.alloc(n)
    engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
    keys = engine.l3_keys(range(n * size))
    tier = engine.l3
    assert tier is not None
    times = []
    for _ in range(max(timer.bench.repeats // 2, 1)):  # as many as each limit is measured
        if tier.rank == tier.roles.writer:
            tier.store.remove([tier.name(k) for k in keys])
        timer.line_up()
        began = time.perf_counter()
        engine.write_back(keys, page_tokens(host, size)).wait()
        _drain(engine)
        times.append(time.perf_counter() - began)
    poison_host(engine, host)
    engine.host_allocator.free(host)
    timer.line_up()
    return keys, expected, min(times)


def limits_of(tier: L3Tier, keys: list[str], timer: Timer, storage: StorageConfig) -> dict:
    """The machine's limits on this case's objects, for the store at hand."""
    repeats = max(timer.bench.repeats // 2, 1)
    if isinstance(tier.store, FileStore):
        return file_limits(
            tier, tier.store, keys, io_threads=storage.io_threads, repeats=repeats, cuda=timer.cuda
        )
    assert isinstance(tier.store, MooncakeStore)
    return mooncake_limits(tier, tier.store, keys, repeats=repeats, cuda=timer.cuda)


def _drain(engine: Engine) -> None:
    while engine.acks.pending:
        engine.poll()
