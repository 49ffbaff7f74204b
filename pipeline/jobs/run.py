"""The `run` job on one rank: fill, back up, evict, load back into other slots, prove bit-exact
(with an L3 store: fill, back up, write back, evict from device and host, load back from L3).
What goes into the pools, and how it is checked, is `pipeline.jobs.contents`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeline.config.job import Job
from pipeline.config.schema import Placement, WorkloadConfig
from pipeline.core.sizing import capacity_problems
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.engine.l3.handles import L3Load, Loading
from pipeline.jobs.contents import (
    fill_random,
    first_mismatch,
    poison,
    poison_host,
    prompt,
    snapshot,
)
from pipeline.jobs.progress import progress


def run_rank(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Entry point of one rank (see `launch`); the trace comes along when a file wants it."""
    return run_report(job, rank, world_size, local_rank, trace=job.runtime.trace_file is not None)


def run_report(
    job: Job, rank: int, world_size: int, local_rank: int, *, trace: bool
) -> dict[str, Any]:
    """`workload.cycles` rounds on this rank, and its report (with its op trace if asked)."""
    engine = open_engine(job.recipe(), local_rank, keep_trace=trace)
    try:
        report = drive(engine, job.workload)
    finally:
        engine.close()
    if trace:
        report["trace"] = engine.trace.ops
    return report


def transfer_pages(engine: Engine, workload: WorkloadConfig) -> int:
    """Pages per transfer; ValueError when they are not whole or the pools cannot hold them."""
    slots_per_page = engine.sizing.slots_per_page
    if workload.num_tokens % slots_per_page:
        raise ValueError(
            f"workload.num_tokens={workload.num_tokens} must be a multiple of "
            f"page_size x dcp_size = {slots_per_page}"
        )
    found = capacity_problems(
        engine.sizing,
        num_tokens=workload.num_tokens,
        device_tokens=engine.sizing.device_slots,
        host_key=workload.host_key,
    )
    if found:
        raise ValueError(found[0].message)
    return workload.num_tokens // slots_per_page


class Cycles:
    """Rounds of backup -> evict -> load-back on one rank, each checked bit-exact (the same
    slot choices on every rank: the draws come from a shared seed). With an L3 store the
    load-back comes from L3: backup -> write-back -> evict device and host -> lookup -> load."""

    def __init__(self, engine: Engine, workload: WorkloadConfig) -> None:
        self.engine, self.workload = engine, workload
        self.num_pages = transfer_pages(engine, workload)
        rng = random.Random(workload.seed)
        self.pick = None if workload.placement is Placement.contiguous else rng
        self.device_alloc = PageAllocator(engine.sizing.device_pages)
        self.seconds = {"backup": 0.0, "write_back": 0.0, "load": 0.0}
        self.l3 = L3Counts()
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
        keys = engine.l3_keys(prompt(engine, self.workload, cycle)) if engine.l3 else []
        if keys:
            host, keys = self.write_back_and_evict(keys, host)
        target = self.device_alloc.alloc(n, pick)  # other slots than the source
        self.device_alloc.free(source)
        poison(engine, source + target)
        start = time.perf_counter()
        handle, missing = self.load_back(keys, page_tokens(host, size), page_tokens(target, size))
        if handle is not None:
            forward(engine, handle)
            handle.done(rt.forward_stream).wait()
        self.seconds["load"] += time.perf_counter() - start
        self.mismatch = self.mismatch or missing or first_mismatch(engine, target, expected)
        while engine.acks.pending:  # release every ack; the ledger is the same on every rank
            engine.poll()
        self.device_alloc.free(target)
        engine.host_allocator.free(host)

    def write_back_and_evict(self, keys: list[str], host: list[int]) -> tuple[list[int], list[str]]:
        """Store the backed-up pages in L3, then drop them from the host tier (poisoned and
        freed): (the free host pages the load-back from L3 reads into, the keys). A prefix
        that write admission declines (`storage.write_admission`: this round's prefix is
        new) stays in the host tier and loads back from there: (its host pages, no keys)."""
        engine, size = self.engine, self.engine.sizing.slots_per_page
        stored = engine.l3 is not None and bool(engine.l3.admission.admitted(keys).all())
        start = time.perf_counter()
        engine.write_back(keys, page_tokens(host, size)).wait()
        self.seconds["write_back"] = (
            self.seconds.get("write_back", 0.0) + time.perf_counter() - start
        )
        while engine.acks.pending:
            engine.poll()
        if not stored:
            return host, []
        poison_host(engine, host)
        engine.host_allocator.free(host)
        return engine.host_allocator.alloc(len(host), self.pick), keys

    def load_back(
        self, keys: list[str], host: torch.Tensor, target: torch.Tensor
    ) -> tuple[Loading | None, str]:
        """Load the pages back (from L3 when there are keys): (the load's handle, where it
        fell short of the whole prefix, or '')."""
        engine = self.engine
        if not keys:
            return engine.load(host, target), ""
        found = engine.lookup(keys)
        loaded = engine.load_from_l3(keys, host, target)
        self.l3.add(loaded)
        if found < len(keys) or loaded.hits < len(keys):
            return loaded.handle, (
                f"rank {engine.runtime.rank}: L3 lookup found {found} and the load read "
                f"{loaded.hits} of {len(keys)} pages"
            )
        return loaded.handle, ""

    def report(self) -> dict[str, Any]:
        return {
            **rank_report(self.engine, self.seconds, self.mismatch),
            **self.l3.report(self.engine),
        }


@dataclass
class L3Counts:
    """What the L3 load-backs of one rank did."""

    hit_pages: int = 0
    fallbacks: int = 0

    def add(self, loaded: L3Load) -> None:
        self.hit_pages += loaded.hits
        self.fallbacks += loaded.fallback

    def report(self, engine: Engine) -> dict[str, Any]:
        """The rank's L3 numbers (none without a store)."""
        if engine.l3 is None:
            return {}
        moved = engine.trace.bytes
        return {
            "l3_write_bytes": moved.get(("l3_write", ""), 0),
            "l3_send_bytes": moved.get(("l3_send", ""), 0),
            "l3_read_bytes": moved.get(("l3_read", ""), 0),
            "l3_misses": engine.trace.counts.get("l3_miss", 0),
            "l3_hit_pages": self.hit_pages,
            "l3_fallbacks": self.fallbacks,
        }


def drive(engine: Engine, workload: WorkloadConfig) -> dict[str, Any]:
    """`workload.cycles` rounds of backup -> evict -> load-back, each checked bit-exact."""
    cycles = Cycles(engine, workload)
    for cycle in progress(range(workload.cycles), "run cycles", rank=engine.runtime.rank):
        cycles.run(cycle)
    return cycles.report()


def forward(engine: Engine, handle: Loading) -> None:
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
