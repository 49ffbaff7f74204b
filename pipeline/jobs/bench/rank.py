"""bench, rank side: link floors, then each case through the framework and the hand-written loop.

One Runtime (process groups, streams) serves every case; each case gets its own Engine. Every
repetition starts with all ranks lined up (CPU barrier + device sync) and is timed on the forward
stream with CUDA events (the host clock on CPU). Every case is also checked bit-exact.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeline.config.job import Job
from pipeline.config.schema import BenchConfig, Placement
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.factory import engine_on, on_same_memory
from pipeline.engine.runtime import Runtime
from pipeline.engine.transfer.pools import HostPool
from pipeline.jobs.bench.reference import Reference
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot
from pipeline.jobs.progress import progress


class Timer:
    """Times regions on this rank; `repeat` lines the ranks up before every repetition."""

    def __init__(self, runtime: Runtime, bench: BenchConfig) -> None:
        self.rt, self.bench = runtime, bench
        self.cuda = runtime.device.type == "cuda"

    def once(self, region: Callable[[], Any]) -> float:
        if not self.cuda:
            began = time.perf_counter()
            region()
            return time.perf_counter() - began
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        region()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def repeat(self, region: Callable[[], Any], lined_up: bool = True) -> list[float]:
        return self.in_turn(region, lined_up=lined_up)[0]

    def in_turn(self, *regions: Callable[[], Any], lined_up: bool = True) -> list[list[float]]:
        """Times of each region, timed one after the other within every repetition (in
        reverse order every other one): a disturbance of the machine then falls on all of them
        alike, and none always runs first."""
        times: list[list[float]] = [[] for _ in regions]
        for i in range(self.bench.warmup + self.bench.repeats):
            turn = list(zip(regions, times, strict=True))
            for region, timed in turn if i % 2 == 0 else reversed(turn):
                if lined_up:
                    self.line_up()
                seconds = self.once(region)
                if i >= self.bench.warmup:
                    timed.append(seconds)
        return times

    def line_up(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.rt.cpu_group.barrier()


def floors(timer: Timer) -> dict[str, float]:
    """Pinned H2D/D2H GB/s of this rank alone and with all ranks at once; broadcast GB/s."""
    rt, n = timer.rt, timer.bench.floor_bytes
    host = torch.empty(n, dtype=torch.uint8, pin_memory=timer.cuda)
    dev = torch.empty(n, dtype=torch.uint8, device=rt.device)
    host.fill_(1)
    copies = {
        "h2d": lambda: dev.copy_(host, non_blocking=True),
        "d2h": lambda: host.copy_(dev, non_blocking=True),
    }
    out = {}
    for name, copy in copies.items():
        for r in range(rt.world_size):  # one rank at a time, the others wait
            timer.line_up()
            if r == rt.rank:
                out[f"{name}_alone_gbps"] = n / statistics.median(timer.repeat(copy, False)) / 1e9
        timer.line_up()
        out[f"{name}_all_gbps"] = n / statistics.median(timer.repeat(copy)) / 1e9
    if rt.world_size > 1:
        first = rt.global_rank(0)
        out["broadcast_gbps"] = (
            n / statistics.median(timer.repeat(lambda: dist.broadcast(dev, src=first))) / 1e9
        )
    return out


@dataclass(frozen=True)
class CasePages:
    """A case's pages: backed up from `source` into `host`, loaded back into `target`."""

    source: list[int]
    host: list[int]
    target: list[int]
    expected: dict[int, torch.Tensor]
    """The source pages' bytes per unit, as filled."""

    @classmethod
    def fill(cls, engine: Engine, case: dict[str, Any]) -> CasePages:
        num_pages = case["tokens"] // engine.sizing.slots_per_page
        contiguous = case["placement"] == Placement.contiguous.value
        pick = None if contiguous else random.Random(0)
        device_alloc = PageAllocator(engine.sizing.device_pages)
        source = device_alloc.alloc(num_pages, pick)
        host = engine.host_allocator.alloc(num_pages, pick)  # the engine's own, as backup asks
        target = device_alloc.alloc(num_pages, pick)
        fill_random(engine, source, seed=engine.runtime.replica_group[0])
        return cls(source, host, target, snapshot(engine, source))


def measure_case(
    timer: Timer, job: Job, case: dict[str, Any], reference_hosts: dict[tuple, HostPool]
) -> dict[str, Any]:
    """One strategy x size x placement x io: framework and reference, both directions."""
    engine = engine_on(job.recipe(), timer.rt)  # the case's pools (see `cases`)
    pages = CasePages.fill(engine, case)
    result = framework(timer, engine, pages, chunked=case["chunk_pages"] > 0)
    contiguous = case["placement"] == Placement.contiguous.value
    result |= reference(timer, engine, pages, reference_hosts, contiguous=contiguous)
    engine.runtime.load_stream.synchronize()
    if engine.graphs is not None:
        result["graphs_captured"] = engine.graphs.captures
    _release(engine)
    return result


def framework(timer: Timer, engine: Engine, pages: CasePages, *, chunked: bool) -> dict[str, Any]:
    """Backups and loads through the engine, their issue time and the ops of one untimed
    transfer each way. A chunked backup is also timed in turn with the same backup unchunked
    (`unchunked_backup_s`): its own case runs minutes apart, on a machine that may change."""
    size = engine.sizing.slots_per_page
    host_t, source_t, target_t = (
        page_tokens(p, size) for p in (pages.host, pages.source, pages.target)
    )
    forward = engine.runtime.forward_stream
    issue: dict[str, list[float]] = {"backup": [], "load": []}

    def backup(on: Engine, issue_s: list[float]) -> None:
        start = time.perf_counter()
        ack = on.backup(host_t, source_t)
        issue_s.append(time.perf_counter() - start)
        forward.wait_event(ack)

    def load(issue_s: list[float]) -> None:
        start = time.perf_counter()
        handle = engine.load(host_t, target_t)
        engine.begin_forward(forward)
        done = handle.done(forward)
        issue_s.append(time.perf_counter() - start)
        forward.wait_event(done)

    backup_here = functools.partial(backup, engine, issue["backup"])
    load_here, untimed_load = functools.partial(load, issue["load"]), functools.partial(load, [])
    result: dict[str, Any] = {"backup_ops": _ops_of(engine, functools.partial(backup, engine, []))}
    result["load_ops"] = _ops_of(engine, untimed_load)
    if chunked:
        unchunked_config = dataclasses.replace(engine.strategy.config, chunk_pages=0)
        unchunked = on_same_memory(
            engine, dataclasses.replace(engine.strategy, config=unchunked_config)
        )
        backup_unchunked = functools.partial(backup, unchunked, [])
        result["unchunked_backup_ops"] = _ops_of(unchunked, backup_unchunked)
        result["backup_s"], result["unchunked_backup_s"] = timer.in_turn(
            backup_here, backup_unchunked
        )
        _release(unchunked)
    else:
        result["backup_s"] = timer.repeat(backup_here)
    result["load_s"] = timer.repeat(load_here)
    timed = {k: v[timer.bench.warmup :] for k, v in issue.items()}
    result["issue_s"] = {k: statistics.median(v) for k, v in timed.items()}
    # the least: a busy host only adds to issue time, so the best repetition is the code's
    # own cost, the median what a scheduler thread on this host pays
    result["best_issue_s"] = {k: min(v) for k, v in timed.items()}
    result["bit_exact"] = _checked(timer, engine, lambda: timer.once(untimed_load), pages)
    return result


def reference(
    timer: Timer,
    engine: Engine,
    pages: CasePages,
    reference_hosts: dict[tuple, HostPool],
    *,
    contiguous: bool,
) -> dict[str, Any]:
    """The same backups and loads through the hand-written loop, on a host buffer of its own
    (one per size, ownership and layout)."""
    model, layout, num_pages = engine.model, engine.topology.mem_layout, len(pages.host)
    key = (num_pages, engine.strategy.config.ownership, layout)
    if key not in reference_hosts:
        owned = engine.owners.owned(engine.runtime.rank, model.units)
        reference_hosts[key] = HostPool.allocate(
            model, owned, num_pages, layout, pin_memory=timer.cuda
        )
    shuffled = random.Random(1).sample(range(num_pages), num_pages)
    order = list(range(num_pages)) if contiguous else shuffled
    ref = Reference(engine, reference_hosts[key], order, pages.source, pages.target, contiguous)
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if timer.cuda else None
    backup = functools.partial(ref.backup, streams)
    load = functools.partial(ref.load, engine.resources.staging, streams)
    issue: dict[str, list[float]] = {"backup": [], "load": []}
    result = {
        "reference_backup_s": timer.repeat(lambda: _host_timed(backup, issue["backup"])),
        "reference_load_s": timer.repeat(lambda: _host_timed(load, issue["load"])),
        "reference_bit_exact": _checked(timer, engine, load, pages),
    }
    warm = timer.bench.warmup
    return result | {
        "reference_issue_s": {k: statistics.median(v[warm:]) for k, v in issue.items()}
    }


def _host_timed(transfer: Callable[[], None], issue_s: list[float]) -> None:
    """The hand loop's own issue time: the same copy calls with the least Python around them,
    what the machine charges the host for them (the framework's issue limit)."""
    start = time.perf_counter()
    transfer()
    issue_s.append(time.perf_counter() - start)


def _ops_of(engine: Engine, transfer: Callable[[], Any]) -> dict[str, int]:
    """The ops one untimed `transfer` issues on this rank, by kind: what a compared side
    really does (a published comparison names them)."""
    before = dict(engine.trace.counts)
    transfer()
    engine.runtime.forward_stream.synchronize()
    after = engine.trace.counts
    return {kind: n - before.get(kind, 0) for kind, n in after.items() if n > before.get(kind, 0)}


def _release(engine: Engine) -> None:
    """Drop an engine's graphs, not its runtime: the bench's runtime serves every case."""
    if engine.graphs is not None:
        engine.graphs.clear()


def _checked(timer: Timer, engine: Engine, load: Callable[[], Any], pages: CasePages) -> bool:
    """Poison the target pages, load once more, and compare every byte (on every rank)."""
    poison(engine, pages.target)
    timer.line_up()
    load()
    timer.line_up()
    return not first_mismatch(engine, pages.target, pages.expected)


def bench_rank(
    payload: tuple[Job, list[tuple[Job, dict]]], rank: int, world_size: int, local_rank: int
) -> dict[str, Any]:
    """Entry point of one rank: floors, then every (job, case) in order."""
    base, cases = payload
    runtime = base.recipe().start_runtime(local_rank)
    timer = Timer(runtime, base.bench)
    try:
        result: dict[str, Any] = {"rank": rank, "floors": floors(timer), "cases": []}
        reference_hosts: dict[tuple, HostPool] = {}
        for job, case in progress(cases, "bench cases", rank=rank):
            result["cases"].append(measure_case(timer, job, case, reference_hosts))
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result
    finally:
        runtime.close()
