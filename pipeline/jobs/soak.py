"""`soak`: many rounds of the `run` workload, every one bit-exact, with each rank's resident
memory read after a warm-up and at the end: what a serving engine's week looks like, shortened.

Memory that grows with each transfer (an op list, a per-poll record, an event kept alive)
shows as growth here; the engine keeps only aggregates unless a trace is asked for.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

from pipeline.config.job import Job
from pipeline.jobs.progress import progress
from pipeline.jobs.run import Cycles, open_engine


def rss_bytes() -> int:
    """This process's resident memory (after a collection, so only live memory counts)."""
    gc.collect()
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def soak_rank(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Entry point of one rank (see `launch`)."""
    engine = open_engine(job, rank, world_size, local_rank)
    soak = job.soak
    try:
        cycles = Cycles(engine, job.workload)
        for cycle in range(soak.warmup_cycles):
            cycles.run(cycle)
        warm = rss_bytes()
        for cycle in progress(range(soak.warmup_cycles, soak.cycles), "soak cycles", rank=rank):
            cycles.run(cycle)
        end = rss_bytes()
        return {
            **cycles.report(),
            "rss_warm_mb": warm / 2**20,
            "rss_end_mb": end / 2**20,
            "rss_growth_mb": (end - warm) / 2**20,
        }
    finally:
        engine.close()


def summarize(job: Job, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    growth = max(r["rss_growth_mb"] for r in ranks)
    return {
        "cycles": job.soak.cycles,
        "warmup_cycles": job.soak.warmup_cycles,
        "strategy": job.verdict.effective_strategy,
        "max_rss_growth_mb": job.soak.max_rss_growth_mb,
        "verified": all(r["verified"] for r in ranks),
        "flat": growth <= job.soak.max_rss_growth_mb,
        "ranks": [
            {k: r[k] for k in ("rank", "rss_warm_mb", "rss_end_mb", "rss_growth_mb", "verified")}
            for r in ranks
        ],
    }
