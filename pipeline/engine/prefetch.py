"""Prefetch: an L3 load's reads started ahead of the load, into free host slots, and the one
agreement that decides which of their pages every rank of the replica group then loads.

`Engine.prefetch` checks the slots, agrees on the plan (as a load from L3 does) and starts the
reads on the I/O threads, then returns at once. `Engine.load_prefetched` settles the reads
under `storage.prefetch_policy`, takes the MIN over the replica group of each reader's leading
intact pages (so a slow reader holds everyone to what it has), loads those, and gives the slots
of the rest back to the free list on every rank: no page is loaded on one rank only, and no
read writes into a slot after it is given back.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

import torch

from pipeline.engine.l3 import L3Tier, ObjectStage
from pipeline.engine.l3_fetch import drain, settle
from pipeline.engine.l3_jobs import ObjectsJob
from pipeline.spec.storage import PrefetchPolicy, StorageConfig


@dataclass
class Prefetch:
    """Reads in flight for a prefix's pages, into the host slots given for them."""

    job: ObjectsJob
    host_indices: torch.Tensor
    started_s: float
    """When the reads started (the fetch latency metric counts from here)."""
    taken: bool = False

    def ready(self, min_hit_pages: int = 1) -> int:
        """Leading pages this rank has read intact so far, without waiting (0 below
        `min_hit_pages`); other ranks may have more or fewer."""
        found = 0
        for read in self.job.reads:
            if not read.done() or read.cancelled() or not read.result():
                break
            found += 1
        return found if found >= min_hit_pages else 0


def start(
    tier: L3Tier, job: ObjectsJob, host_indices: torch.Tensor, stages: tuple[ObjectStage, ...]
) -> Prefetch:
    """Run the strategy's fetch stages up to the last, which agrees on hits: the plan's
    agreement (dedup strategies) and the reads' start. A plan the ranks disagree on reads
    nothing (a fallback reads into device pages, not known yet), and its load finds no page."""
    started = time.monotonic()
    for stage in stages[:-1]:
        if job.fallback:
            break
        stage.on_objects(job, tier)
    return Prefetch(job, host_indices, started)


def agreed_pages(tier: L3Tier, prefetch: Prefetch, storage: StorageConfig) -> int:
    """The leading pages every reader of the group read intact under the policy (0 below
    `storage.min_hit_pages`); every read is settled when it returns."""
    job, policy = prefetch.job, storage.prefetch_policy
    try:
        if policy is PrefetchPolicy.timeout:
            concurrent.futures.wait(job.reads, timeout=storage.prefetch_timeout_s)
        complete = policy is PrefetchPolicy.wait_complete
        mine = 0 if job.fallback else settle(tier, job, 0, len(job.keys), wait=complete)
        agreed = min(tier.agree(mine))
    finally:
        drain(job)  # cancel what has not started, wait for what has: nothing writes later
    return agreed if agreed >= storage.min_hit_pages else 0
