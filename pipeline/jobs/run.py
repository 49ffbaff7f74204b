"""The `run` job on one rank: fill, back up, evict, load back into other slots, prove bit-exact.

Every rank of a replica group fills its device pool with the same random bytes (MLA: they hold
the same latent KV), so a dedup strategy must reproduce on each rank exactly what that rank
backed up. Evicted and fresh slots are poisoned, so stale bytes can never pass the check.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
import torch.distributed as dist

from pipeline.config.job import Job
from pipeline.config.schema import Placement, WorkloadConfig
from pipeline.engine.engine import Engine
from pipeline.engine.executor import LoadHandle
from pipeline.engine.runtime import Runtime, pick_backend, pick_device
from pipeline.spec.slots import PageAllocator, page_tokens

POISON = 0xA5
"""Byte written into evicted and freshly allocated slots before a load-back."""


def backend_of(job: Job, local_rank: int = 0) -> str:
    """The process-group backend the job's ranks use (the parent and every rank agree)."""
    return pick_backend(job.runtime.backend, pick_device(job.topology.device, local_rank))


def start_runtime(job: Job, rank: int, world_size: int, local_rank: int) -> Runtime:
    """This rank's process groups and streams for the job."""
    return Runtime.start(
        job.topology,
        job.model,
        rank=rank,
        world_size=world_size,
        device=pick_device(job.topology.device, local_rank),
        backend=backend_of(job, local_rank),
        timeout_s=job.runtime.timeout_s,
    )


def open_engine(
    job: Job, rank: int, world_size: int, local_rank: int, *, keep_trace: bool = False
) -> Engine:
    """Groups, streams and pools of one rank for the job (`keep_trace`: every op in order)."""
    runtime = start_runtime(job, rank, world_size, local_rank)
    try:
        return Engine.create(
            job.strategy,
            runtime,
            job.model,
            job.topology,
            device_tokens=job.workload.device_tokens,
            host_ratio=job.workload.host_ratio,
            debug_consensus=job.runtime.debug_consensus,
            keep_trace=keep_trace,
            storage=job.storage,
        )
    except BaseException:
        runtime.close()
        raise


def run_rank(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Entry point of one rank (see `launch`); the trace comes along when a file wants it."""
    return run_report(job, rank, world_size, local_rank, trace=job.runtime.trace_file is not None)


def run_report(
    job: Job, rank: int, world_size: int, local_rank: int, *, trace: bool
) -> dict[str, Any]:
    """`workload.cycles` rounds on this rank, and its report (with its op trace if asked)."""
    engine = open_engine(job, rank, world_size, local_rank, keep_trace=trace)
    try:
        report = drive(engine, job.workload)
    finally:
        engine.close()
    if trace:
        report["trace"] = engine.trace.ops
    return report


def fill_random(engine: Engine, pages: list[int], seed: int) -> None:
    """Random bytes into device pages, drawn on the pool's device from `seed` (seeded per
    replica group, so peers draw the same bytes)."""
    device = engine.runtime.device
    generator = torch.Generator(device=device).manual_seed(seed)
    index = torch.tensor(pages, dtype=torch.int64, device=device)
    for unit in engine.model.units:
        layer = engine.device_pool.layer(unit).view(torch.uint8)
        shape = (len(pages), *layer.shape[1:])
        data = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator, device=device)
        layer.index_copy_(0, index, data)


def poison(engine: Engine, pages: list[int]) -> None:
    index = torch.tensor(pages, dtype=torch.int64, device=engine.runtime.device)
    for unit in engine.model.units:
        engine.device_pool.layer(unit).view(torch.uint8).index_fill_(0, index, POISON)


def snapshot(engine: Engine, pages: list[int]) -> dict[int, torch.Tensor]:
    index = torch.tensor(pages, dtype=torch.int64, device=engine.runtime.device)
    return {
        u.ordinal: engine.device_pool.layer(u).view(torch.uint8).index_select(0, index)
        for u in engine.model.units
    }


def first_mismatch(engine: Engine, pages: list[int], expected: dict[int, torch.Tensor]) -> str:
    """'' when every unit's pages equal the expected bytes, else where they first differ."""
    got = snapshot(engine, pages)
    for unit in engine.model.units:
        bad = (got[unit.ordinal] != expected[unit.ordinal]).flatten(1).any(1).nonzero()
        if len(bad):
            page = int(bad[0])
            return (
                f"rank {engine.runtime.rank}: {unit.pool} layer {unit.layer} differs at "
                f"transfer page {page} (device page {pages[page]}); {len(bad)} pages differ"
            )
    return ""


def transfer_pages(engine: Engine, workload: WorkloadConfig) -> int:
    slots_per_page = engine.sizing.slots_per_page
    if workload.num_tokens % slots_per_page:
        raise ValueError(
            f"workload.num_tokens={workload.num_tokens} must be a multiple of "
            f"page_size x dcp_size = {slots_per_page}"
        )
    pages = workload.num_tokens // slots_per_page
    if 2 * pages > engine.sizing.device_pages:
        raise ValueError(
            f"workload.device_tokens={workload.device_tokens} must hold twice "
            f"num_tokens={workload.num_tokens} (backup source + load target)"
        )
    if pages > engine.sizing.host.num_pages:
        raise ValueError(
            f"the host pool holds {engine.sizing.host_slots} tokens < num_tokens="
            f"{workload.num_tokens}; raise workload.host_ratio"
        )
    return pages


class Cycles:
    """Rounds of backup -> evict -> load-back on one rank, each checked bit-exact (the same
    slot choices on every rank: the draws come from a shared seed)."""

    def __init__(self, engine: Engine, workload: WorkloadConfig) -> None:
        self.engine, self.workload = engine, workload
        self.num_pages = transfer_pages(engine, workload)
        rng = random.Random(workload.seed)
        self.pick = None if workload.placement is Placement.contiguous else rng
        self.device_alloc = PageAllocator(engine.sizing.device_pages)
        self.seconds = {"backup": 0.0, "load": 0.0}
        self.mismatch = ""
        """Where the first round that was not bit-exact differed ('' while all were)."""

    def run(self, cycle: int) -> None:
        engine, pick, n = self.engine, self.pick, self.num_pages
        rt, size = engine.runtime, engine.sizing.slots_per_page
        source = self.device_alloc.alloc(n, pick)
        fill_random(
            engine, source, self.workload.seed * 1_000_003 + cycle * 7919 + rt.replica_group[0]
        )
        expected = snapshot(engine, source)
        host = engine.host_allocator.alloc(n, pick)
        start = time.perf_counter()
        engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
        self.seconds["backup"] += time.perf_counter() - start
        target = self.device_alloc.alloc(n, pick)  # other slots than the source
        self.device_alloc.free(source)
        poison(engine, source + target)
        start = time.perf_counter()
        handle = engine.load(page_tokens(host, size), page_tokens(target, size))
        forward(engine, handle)
        handle.done(rt.forward_stream).wait()
        self.seconds["load"] += time.perf_counter() - start
        self.mismatch = self.mismatch or first_mismatch(engine, target, expected)
        while engine.acks.pending:  # release both acks; the ledger is the same on every rank
            engine.poll()
        self.device_alloc.free(target)
        engine.host_allocator.free(host)

    def report(self) -> dict[str, Any]:
        return rank_report(self.engine, self.seconds, self.mismatch)


def drive(engine: Engine, workload: WorkloadConfig) -> dict[str, Any]:
    """`workload.cycles` rounds of backup -> evict -> load-back, each checked bit-exact."""
    cycles = Cycles(engine, workload)
    for cycle in range(workload.cycles):
        cycles.run(cycle)
    return cycles.report()


def forward(engine: Engine, handle: LoadHandle) -> None:
    """A stand-in forward pass: per layer, wait for it, then the TP all-reduce a model does."""
    rt = engine.runtime
    engine.begin_forward(rt.forward_stream)
    activation = torch.ones(8, device=rt.device)
    for layer in range(handle.num_layers):
        handle.wait(layer, rt.forward_stream)
        dist.all_reduce(activation)


def rank_report(engine: Engine, seconds: dict[str, float], mismatch: str) -> dict[str, Any]:
    trace = engine.trace
    moved = trace.bytes
    d2h, h2d = moved.get(("copy", "d2h"), 0), moved.get(("copy", "h2d"), 0)
    received = moved.get(("broadcast", "received"), 0)
    return {
        "rank": engine.runtime.rank,
        "d2h_bytes": d2h,
        "h2d_bytes": h2d,
        "broadcast_send_bytes": moved.get(("broadcast", "sent"), 0),
        "broadcast_recv_bytes": received,
        "host_capacity_tokens": engine.sizing.host_slots,
        "host_pool_bytes": engine.host_pool.nbytes,
        "ops": sum(trace.counts.values()),
        "ops_by_kind": dict(trace.counts),
        "stage_seconds": dict(sorted(engine.resources.timings_s.items())),
        "transfer_seconds": seconds,
        "gbps": {
            "backup": d2h / seconds["backup"] / 1e9 if seconds["backup"] else 0.0,
            "load": (h2d + received) / seconds["load"] / 1e9 if seconds["load"] else 0.0,
        },
        "verified": not mismatch,
        "mismatch": mismatch,
    }
