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
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from pipeline.assemble import Strategy, assemble
from pipeline.bench.reference import Reference
from pipeline.config import typed
from pipeline.engine import Engine
from pipeline.graphs import TransferGraphs
from pipeline.pools import HostPool, PageAllocator, page_tokens
from pipeline.runtime import Runtime, pick_device
from pipeline.schema import BenchConfig, Placement
from pipeline.topology import ModelGeometry, Topology
from pipeline.workload import fill_random, first_mismatch, poison, snapshot


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
        dist.barrier(group=self.rt.cpu_group)


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
        out["broadcast_gbps"] = (
            n / statistics.median(timer.repeat(lambda: dist.broadcast(dev, src=0))) / 1e9
        )
    return out


def measure_case(
    timer: Timer, plain: dict, case: dict[str, Any], reference_hosts: dict[tuple, HostPool]
) -> dict[str, Any]:
    """One strategy x size x placement x io: framework and reference, both directions. A
    chunked backup is also timed in turn with the same backup unchunked (`unchunked_backup_s`):
    its own case runs minutes apart, on a machine whose speed may have moved by then."""
    rt, tokens = timer.rt, case["tokens"]
    engine = _engine(rt, plain, tokens)
    model, topology = engine.model, engine.topology
    num_pages = tokens // engine.sizing.widened
    pick = None if case["placement"] == Placement.contiguous.value else random.Random(0)
    device_alloc = PageAllocator(engine.sizing.device_pages)
    source = device_alloc.alloc(num_pages, pick)
    host = PageAllocator(engine.sizing.host.num_pages).alloc(num_pages, pick)
    target = device_alloc.alloc(num_pages, pick)
    fill_random(engine, source, seed=rt.replica_group[0])
    expected = snapshot(engine, source)
    size = engine.sizing.widened
    host_t, source_t, target_t = (page_tokens(p, size) for p in (host, source, target))
    forward = rt.forward_stream
    issue: dict[str, list[float]] = {"backup": [], "load": []}

    def backup(on: Engine, issue_s: list[float]) -> None:
        start = time.perf_counter()
        ack = on.backup(host_t, source_t)
        issue_s.append(time.perf_counter() - start)
        forward.wait_event(ack)

    def load() -> None:
        start = time.perf_counter()
        handle = engine.load(host_t, target_t)
        engine.begin_forward(forward)
        done = handle.done(forward)
        issue["load"].append(time.perf_counter() - start)
        forward.wait_event(done)

    result: dict[str, Any] = {}
    backup_here = functools.partial(backup, engine, issue["backup"])
    result["backup_ops"] = _ops_of(engine, backup_here)
    if case["chunk_pages"]:
        unchunked = _on_same_memory(engine, dataclasses.replace(engine.strategy, chunk_pages=0))
        backup_unchunked = functools.partial(backup, unchunked, [])
        result["unchunked_backup_ops"] = _ops_of(unchunked, backup_unchunked)
        result["backup_s"], result["unchunked_backup_s"] = timer.in_turn(
            backup_here, backup_unchunked
        )
        _release(unchunked)
    else:
        result["backup_s"] = timer.repeat(backup_here)
    result["load_s"] = timer.repeat(load)
    result["issue_s"] = {k: statistics.median(v[timer.bench.warmup :]) for k, v in issue.items()}
    result["bit_exact"] = _checked(timer, engine, lambda: timer.once(load), target, expected)

    key = (tokens, plain["strategy"]["ownership"], topology.mem_layout)
    if key not in reference_hosts:  # one buffer per size, ownership and layout
        reference_hosts[key] = HostPool.allocate(
            model,
            engine.owners.owned(rt.rank, model.units),
            num_pages,
            topology.mem_layout,
            pin_memory=timer.cuda,
        )
    contiguous = pick is None
    ref = Reference(
        engine,
        reference_hosts[key],
        list(range(num_pages))
        if contiguous
        else random.Random(1).sample(range(num_pages), num_pages),
        source,
        target,
        contiguous,
    )
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if timer.cuda else None
    result["reference_backup_s"] = timer.repeat(lambda: ref.backup(streams))
    result["reference_load_s"] = timer.repeat(lambda: ref.load(engine.staging, streams))
    result["reference_bit_exact"] = _checked(
        timer, engine, lambda: ref.load(engine.staging, streams), target, expected
    )
    engine.runtime.load_stream.synchronize()
    if engine.graphs is not None:
        result["graphs_captured"] = engine.graphs.captures
    _release(engine)
    return result


def _engine(runtime: Runtime, plain: dict, tokens: int) -> Engine:
    """A case's engine on the bench's runtime: room for source and target pages on the device,
    and for one transfer on the host."""
    cfg = typed(plain)
    model: ModelGeometry = OmegaConf.to_object(cfg.model)  # type: ignore[assignment]
    topology: Topology = OmegaConf.to_object(cfg.topology)  # type: ignore[assignment]
    return Engine.create(
        assemble(cfg.strategy), runtime, model, topology, device_tokens=2 * tokens, host_ratio=0.5
    )


def _on_same_memory(engine: Engine, strategy: Strategy) -> Engine:
    """`engine`'s pools and buffers under other knobs of the same strategy, so both sides of
    an in-turn comparison move the same bytes between the same memory."""
    return Engine(
        strategy=strategy,
        runtime=engine.runtime,
        model=engine.model,
        topology=engine.topology,
        owners=engine.owners,
        sizing=engine.sizing,
        device_pool=engine.device_pool,
        host_pool=engine.host_pool,
        host_view=engine.host_view,
        staging=engine.staging,
        batch_staging=engine.batch_staging,
        acks=engine.acks,
        graphs=None if engine.graphs is None else TransferGraphs(strategy.cuda_graphs),
    )


def _ops_of(engine: Engine, transfer: Callable[[], Any]) -> dict[str, int]:
    """The ops one untimed `transfer` issues on this rank, by kind: what a compared side
    really does (a published comparison names them)."""
    first = len(engine.trace.ops)
    transfer()
    engine.runtime.forward_stream.synchronize()
    ops: dict[str, int] = {}
    for op in engine.trace.ops[first:]:
        ops[op["op"]] = ops.get(op["op"], 0) + 1
    return ops


def _release(engine: Engine) -> None:
    """Drop an engine's graphs, not its runtime: the bench's runtime serves every case."""
    if engine.graphs is not None:
        engine.graphs.clear()


def _checked(
    timer: Timer, engine: Engine, load: Callable[[], Any], target: list[int], expected: dict
) -> bool:
    """Poison the target pages, load once more, and compare every byte (on every rank)."""
    poison(engine, target)
    timer.line_up()
    load()
    timer.line_up()
    return not first_mismatch(engine, target, expected)


def bench_rank(job: dict[str, Any], rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Entry point of one rank: floors, then every case in order."""
    cfg = typed(job["base"])
    model: ModelGeometry = OmegaConf.to_object(cfg.model)  # type: ignore[assignment]
    topology: Topology = OmegaConf.to_object(cfg.topology)  # type: ignore[assignment]
    bench: BenchConfig = OmegaConf.to_object(cfg.bench)  # type: ignore[assignment]
    runtime = Runtime.start(
        topology,
        model,
        rank=rank,
        world_size=world_size,
        device=pick_device(topology.device, local_rank),
        backend=job["backend"],
        timeout_s=cfg.runtime.timeout_s,
    )
    timer = Timer(runtime, bench)
    try:
        result: dict[str, Any] = {"rank": rank, "floors": floors(timer), "cases": []}
        reference_hosts: dict[tuple, HostPool] = {}
        for plain, case in job["cases"]:
            result["cases"].append(measure_case(timer, plain, case, reference_hosts))
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result
    finally:
        runtime.close()
