"""One case of `bench bench=ttft` on one rank: a cached prefix as a hit (from the host tier, or
from L3 after a write-back and an eviction from the host tier), and per new-token count the
synthetic forward alone, the load alone, load then forward, the forward consuming the layers
as they arrive, and recomputing the prefix; then one poisoned, checked overlapped run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.l3.handles import Loading
from pipeline.engine.l3.load import StreamedLoad
from pipeline.jobs.bench.forward import PublishedConfig, SyntheticForward, forward_flops
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.contents import fill_random, first_mismatch, poison, poison_host, snapshot

Recomputed = dict[tuple[int, int], dict[str, Any]]
"""(prefix, new tokens) -> the recompute's times on this rank (the same for every store)."""


class Prefix:
    """`tokens` cached tokens of one engine, loaded as a hit into the same target pages."""

    def __init__(self, engine: Engine, tokens: int) -> None:
        self.engine, size = engine, engine.sizing.slots_per_page
        n = tokens // size
        source, self.target = list(range(n)), list(range(n, 2 * n))
        fill_random(engine, source, n * size + engine.runtime.replica_group[0])
        self.expected = snapshot(engine, source)
        self.host = engine.host_allocator.alloc(n)
        engine.backup(page_tokens(self.host, size), page_tokens(source, size)).wait()
        self.target_slots = page_tokens(self.target, size)
        self.keys: list[str] = []
        self.fresh: list[int] = []
        self.hits = n
        self.streamed = False
        """The last load from L3 streamed its layers (`storage.stream_layers`)."""
        if engine.l3 is not None:  # write back, then forget the host copy: an L3 hit
            self.keys = engine.l3_keys(range(n * size))
            engine.write_back(self.keys, page_tokens(self.host, size)).wait()
            self.release()
            poison_host(engine, self.host)
            engine.host_allocator.free(self.host)
        self.release()

    def load(self) -> Loading:
        """Issue the hit's load (from L3: look it up and read it first, as a server would)."""
        engine, size = self.engine, self.engine.sizing.slots_per_page
        if engine.l3 is None:
            return engine.load(page_tokens(self.host, size), self.target_slots)
        self.fresh = engine.host_allocator.alloc(len(self.target))
        engine.lookup(self.keys)
        loaded = engine.load_from_l3(self.keys, page_tokens(self.fresh, size), self.target_slots)
        self.hits = min(self.hits, loaded.hits)
        self.streamed = isinstance(loaded.handle, StreamedLoad)
        if loaded.handle is None:
            raise RuntimeError(f"the prefix's load from L3 fell back ({loaded.hits} hits)")
        return loaded.handle

    def release(self) -> None:
        """After a load: its acks released, its fresh host pages freed."""
        while self.engine.acks.pending:
            self.engine.poll()
        if self.fresh:
            self.engine.host_allocator.free(self.fresh)
            self.fresh = []

    def layers(self) -> list[list[torch.Tensor]]:
        """Each model layer's target pages, per unit (what its forward layer reads)."""
        pool, first, stop = self.engine.device_pool, self.target[0], self.target[-1] + 1
        found: list[list[torch.Tensor]] = [[] for _ in range(self.engine.model.num_layers)]
        for unit in self.engine.model.units:
            found[unit.layer].append(pool.layer(unit)[first:stop])
        return found

    def expected_digests(self) -> list[int]:
        """What each layer's digest must be: the sum of its bytes as backed up."""
        sums = [0] * self.engine.model.num_layers
        for unit in self.engine.model.units:
            sums[unit.layer] += int(self.expected[unit.ordinal].sum(dtype=torch.int64))
        return sums


def measure_ttft_case(
    timer: Timer,
    engine: Engine,
    config: PublishedConfig,
    case: dict[str, Any],
    new_tokens: list[int],
    recomputed: Recomputed,
) -> dict[str, Any]:
    """Every new-token count of one store x size x strategy case (see the module doc)."""
    prefix = Prefix(engine, case["tokens"])
    rows = []
    for new in new_tokens:
        rows.append(_new_tokens(timer, prefix, config, new, recomputed))
        if timer.cuda:
            torch.cuda.empty_cache()
    return {
        "rows": rows,
        "hits": prefix.hits,
        "pages": len(prefix.target),
        "streamed": prefix.streamed,
    }


def _new_tokens(
    timer: Timer, prefix: Prefix, config: PublishedConfig, new: int, recomputed: Recomputed
) -> dict[str, Any]:
    """One row: the hit's runs, and the recompute of its prefix and new tokens (once per
    prefix and new-token count on this rank, whatever the store)."""
    engine, tokens = prefix.engine, len(prefix.target) * prefix.engine.sizing.slots_per_page
    result = time_hit(timer, prefix, config, new)
    if (tokens, new) not in recomputed:
        recomputed[(tokens, new)] = _recompute(timer, engine, config, tokens + new)
    layers = engine.model.num_layers
    return (
        result | recomputed[(tokens, new)] | {"flops": forward_flops(config, layers, tokens, new)}
    )


def time_hit(timer: Timer, prefix: Prefix, config: PublishedConfig, new: int) -> dict[str, Any]:
    """The forward alone, the load alone, load then forward, and overlapped, in turn."""
    engine, tokens = prefix.engine, len(prefix.target) * prefix.engine.sizing.slots_per_page
    layers, fwd = engine.model.num_layers, engine.runtime.forward_stream
    forward = SyntheticForward(config, layers, engine.runtime.device, prefix=tokens, new=new)
    loaded = prefix.layers()

    def load_alone() -> None:
        fwd.wait_event(prefix.load().done(fwd))

    def serial() -> None:
        load_alone()
        forward.run(fwd, None, loaded)

    def overlapped() -> None:
        loading = prefix.load()
        forward.run(fwd, loading, loaded)
        fwd.wait_event(loading.done(fwd))

    regions = {
        "load_s": load_alone,
        "compute_s": lambda: forward.run(fwd, None, loaded),
        "serial_s": serial,
        "overlapped_s": overlapped,
    }
    times = _in_turn(timer, regions, prefix.release)
    return {"new_tokens": new, **times, **_checked(timer, prefix, forward)}


def _in_turn(
    timer: Timer, regions: dict[str, Callable[[], Any]], release: Callable[[], None]
) -> dict[str, list[float]]:
    """Each region's times, timed one after the other within every repetition (in reverse
    order every other one, so none always runs first), each load released after its region."""
    times: dict[str, list[float]] = {name: [] for name in regions}
    for i in range(timer.bench.warmup + timer.bench.repeats):
        turn = list(regions.items())
        for name, region in turn if i % 2 == 0 else reversed(turn):
            timer.line_up()
            seconds = timer.once(region)
            release()
            if i >= timer.bench.warmup:
                times[name].append(seconds)
    return times


def _checked(timer: Timer, prefix: Prefix, forward: SyntheticForward) -> dict[str, Any]:
    """One overlapped run into poisoned target pages: the bytes are the backed-up ones, each
    layer's digest (read right after its wait) saw them whole, and the waits were per layer."""
    engine, fwd = prefix.engine, prefix.engine.runtime.forward_stream
    poison(engine, prefix.target)
    order: list[tuple[str, int]] = []
    before = forward.flops
    timer.line_up()
    loading = prefix.load()
    digests = forward.run(fwd, loading, prefix.layers(), order)
    fwd.wait_event(loading.done(fwd))
    timer.line_up()
    prefix.release()
    per_layer = [
        (step, layer) for layer in range(forward.num_layers) for step in ("wait", "compute")
    ]
    return {
        "bit_exact": not first_mismatch(engine, prefix.target, prefix.expected),
        "digests_match": [int(d) for d in digests] == prefix.expected_digests(),
        "waits_per_layer": order == per_layer,
        "issued_flops": forward.flops - before,
    }


def _recompute(timer: Timer, engine: Engine, config: PublishedConfig, tokens: int) -> dict:
    """The same forward over all of the prefix and the new tokens, nothing loaded."""
    layers, fwd = engine.model.num_layers, engine.runtime.forward_stream
    forward = SyntheticForward(config, layers, engine.runtime.device, prefix=0, new=tokens)
    times = timer.repeat(lambda: forward.run(fwd, None, None))
    return {"recompute_s": times, "recompute_flops": forward_flops(config, layers, 0, tokens)}
