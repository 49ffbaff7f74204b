"""`soak`: many rounds of the `run` workload, every one bit-exact, with each rank's resident
memory read after a warm-up, halfway and at the end: a serving engine's week, shortened.

Memory that grows with each transfer (an op list, a per-poll record, an event kept alive)
shows as growth here; the engine keeps only aggregates unless a trace is asked for.
"""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path
from typing import Any

from pipeline.config.job import Job
from pipeline.engine.factory import open_engine
from pipeline.jobs.progress import progress
from pipeline.jobs.run import Cycles


def rss_bytes() -> int:
    """This process's resident memory (after a collection, so only live memory counts)."""
    gc.collect()
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def soak_rank(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Entry point of one rank (see `launch`)."""
    engine = open_engine(job.recipe(), local_rank)
    soak = job.soak
    try:
        cycles = Cycles(engine, job.workload)
        for cycle in range(soak.warmup_cycles):
            cycles.run(cycle)
        warm = rss_bytes()
        middle, mid = (soak.warmup_cycles + soak.cycles) // 2, warm
        for cycle in progress(range(soak.warmup_cycles, soak.cycles), "soak cycles", rank=rank):
            if cycle == middle:
                mid = rss_bytes()
            cycles.run(cycle)
        end = rss_bytes()
        return {
            **cycles.report(),
            "rss_warm_mb": warm / 2**20,
            "rss_end_mb": end / 2**20,
            "rss_growth_mb": (end - warm) / 2**20,
            "rss_late_growth_mb": (end - mid) / 2**20,
            "metrics": engine.stats(),  # what /metrics shows at the end
        }
    finally:
        engine.close()


def is_flat(growth_mb: float, late_growth_mb: float, most_mb: float) -> bool:
    """At most `most_mb` of growth after the warm-up, and at most half of it in the second
    half of the rounds: a one-time rise (a cache filling, the allocator settling) happens
    early and stops, while a leak keeps growing with every round, to the end of a week."""
    return growth_mb <= most_mb and late_growth_mb <= most_mb / 2


def summarize(job: Job, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    most = job.soak.max_rss_growth_mb
    keys = ("rank", "rss_warm_mb", "rss_end_mb", "rss_growth_mb", "rss_late_growth_mb")
    return {
        "cycles": job.soak.cycles,
        "warmup_cycles": job.soak.warmup_cycles,
        "strategy": job.verdict.effective_strategy,
        "max_rss_growth_mb": most,
        "verified": all(r["verified"] for r in ranks),
        "flat": all(is_flat(r["rss_growth_mb"], r["rss_late_growth_mb"], most) for r in ranks),
        "ranks": [{k: r[k] for k in (*keys, "verified")} for r in ranks],
        "metrics": [metrics_summary(r["metrics"]) for r in ranks],
        "stats": [r["metrics"] for r in ranks],  # each rank's engine.stats() at the end
    }


def metrics_summary(stats: dict[str, float]) -> dict[str, Any]:
    """A rank's metrics at the end, in short: bytes per tier and direction, the L3 counts,
    and each latency's count and mean (the whole set is `engine.stats()`, or /metrics)."""
    moved = {
        " ".join(re.findall(r'(?:tier|direction)="([a-z_0-9]+)"', key)[::-1]): int(value)
        for key, value in stats.items()
        if key.startswith("hicache_bytes_total{") and value
    }  # "host backup": tier then direction (the labels sort direction first)
    l3 = {
        key[len("hicache_l3_") : -len("_total")]: int(value)
        for key, value in stats.items()
        if key.startswith("hicache_l3_") and key.endswith("_total")
    }
    latency = {}
    for op in ("backup", "load", "write_back", "fetch"):
        count = stats[f"hicache_{op}_seconds_count"]
        if count:
            mean_ms = stats[f"hicache_{op}_seconds_sum"] / count * 1e3
            latency[op] = {"count": int(count), "mean_ms": round(mean_ms, 3)}
    return {"bytes": moved, "l3": l3, "latency": latency}
