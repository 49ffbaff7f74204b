"""Prefetch: an L3 load's reads started ahead of the load, into free host slots, and the one
agreement that decides which of their pages every rank of the replica group then loads.

`Engine.prefetch` checks the slots, agrees on the plan (as a load from L3 does) and starts the
reads on the I/O threads, then returns at once. From then on the host slots are the
prefetch's: every call naming them is refused until `Engine.load_prefetched` or
`Prefetch.cancel` ends it. `Engine.load_prefetched` checks its arguments and agrees with the
replica group that no rank refused them (a refusal on any rank refuses the load on every rank,
and leaves the prefetch as it was), settles the reads under `storage.prefetch_policy`, takes
the MIN over the replica group of each reader's leading intact pages (so a slow reader holds
everyone to what it has), loads those, and gives the slots of the rest back to the free list
on every rank: no page is loaded on one rank only, and no read writes into a slot after it is
given back.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass

import torch

from pipeline.core.plan import PlanSpec
from pipeline.core.slots import PageAllocator, pages_of
from pipeline.core.storage import PrefetchPolicy
from pipeline.engine.l3.fetch import drain, settle
from pipeline.engine.l3.jobs import ObjectsJob
from pipeline.engine.l3.tier import L3Tier, ObjectStage


@dataclass
class Prefetch:
    """Reads in flight for a prefix's pages, into the host slots given for them, which are the
    prefetch's until `Engine.load_prefetched` or `cancel` ends it."""

    job: ObjectsJob
    host_indices: torch.Tensor
    started_s: float
    """When the reads started (the fetch latency metric counts from here)."""
    slots: PageAllocator
    """The engine's host pages, which lend the prefetch its pages."""
    ended: str = ""
    """How it ended ('loaded', 'cancelled', 'failed'); '' while its reads own its slots."""

    @property
    def name(self) -> str:
        """How refusals name it."""
        keys = self.job.keys
        return f"a prefetch of {len(keys)} pages (keys {keys[0]}..{keys[-1]})"

    def ready(self, min_hit_pages: int = 1) -> int:
        """Leading pages this rank has read intact so far, without waiting (0 below
        `min_hit_pages`); other ranks may have more or fewer."""
        found = 0
        for first, stop, read in self.job.reads:
            if not read.done() or read.cancelled():
                break
            found = first + read.result()
            if found < stop:
                break
        return found if found >= min_hit_pages else 0

    def cancel(self) -> None:
        """Stop the reads (those not started never run; this waits for the running ones, so
        no read writes into the slots after it returns) and give every slot of the prefetch
        back to the free list, holding no data; a no-op once loaded or cancelled. Not a
        collective (its reads are this rank's own), but it changes the replicated free list:
        call it on every rank alike, as `host_slots.free`."""
        if not self.ended:
            self.end("cancelled")

    def end(self, how: str, *, free: slice = slice(None)) -> None:
        """Wait out the reads and take the slots back: those of the pages in `free` go back
        to the free list, the rest stay allocated."""
        drain(self.job)
        self.ended = how
        pages = self.job.host_pages
        self.slots.take_back(pages)
        self.slots.free(pages[free].tolist())


def start(
    tier: L3Tier,
    job: ObjectsJob,
    host_indices: torch.Tensor,
    stages: tuple[ObjectStage, ...],
    slots: PageAllocator,
) -> Prefetch:
    """Lend the job's host pages to the prefetch and run the strategy's fetch stages up to
    the last, which agrees on hits: the plan's agreement (dedup strategies) and the reads'
    start. A plan the ranks disagree on reads nothing (a fallback reads into device pages,
    not known yet), and its load finds no page. Its keys count as named for write
    admission."""
    # a copy: the caller may reuse its tensor, and the load takes the slots checked here
    prefetch = Prefetch(job, host_indices.clone(), time.monotonic(), slots)
    slots.lend(job.host_pages, prefetch.name)
    tier.admission.named(job.keys)  # a prefetch is a lookup that reads: its pages count
    try:
        for stage in stages[:-1]:
            if job.fallback:
                break
            stage.on_objects(job, tier)
    except BaseException:
        prefetch.end("failed", free=slice(0))  # the caller's slots again, as before the call
        raise
    return prefetch


def refused(
    prefetch: Prefetch, device_indices: torch.Tensor, spec: PlanSpec, slots: PageAllocator
) -> str:
    """Why this rank refuses to load `prefetch` into `device_indices` ('' if it does not):
    checked before anything changes, then agreed on with the group (`agreed_pages`); a
    `prefetch` that is not one of this engine's (`slots`) raises at once."""
    if not isinstance(prefetch, Prefetch) or prefetch.slots is not slots:
        raise ValueError("prefetch must be a Prefetch that this engine's prefetch returned")
    if prefetch.ended:
        return f"prefetch: {prefetch.name} was {prefetch.ended} already"
    try:
        pages = pages_of("device_indices", device_indices, spec.slots_per_page, spec.device_slots)
    except ValueError as e:
        return str(e)
    if len(pages) != len(prefetch.job.keys):
        return (
            f"device_indices has {len(pages)} pages for the {len(prefetch.job.keys)} pages "
            "prefetched: pass one device slot per prefetched host slot"
        )
    return ""


def agreed_pages(tier: L3Tier, prefetch: Prefetch, refusal: str) -> int:
    """The leading pages every reader of the group read intact under the policy (0 below
    `storage.min_hit_pages`), agreed together with every rank's `refusal` of its arguments
    ('' for none): a refusal on any rank raises ValueError on every rank, with the prefetch
    left as it was (its reads go on). Otherwise every read is settled when it returns; if
    settling fails, the prefetch ends, its slots back on the free list."""
    job, storage = prefetch.job, tier.storage
    policy = storage.prefetch_policy
    try:
        if policy is PrefetchPolicy.timeout and not refusal:
            reads = [read for _, _, read in job.reads]
            concurrent.futures.wait(reads, timeout=storage.prefetch_timeout_s)
        complete = policy is PrefetchPolicy.wait_complete
        read = refusal or job.fallback
        mine = 0 if read else settle(tier, job, 0, len(job.keys), wait=complete)
        found, refused = tier.agree_while((mine, refusal), bool(refusal))
    except BaseException:
        prefetch.end("failed")
        raise
    if refused:
        said = [why for _, why in found if why] or ["a rank of another replica group refused"]
        raise ValueError(refusal or f"load_prefetched refused on another rank: {said[0]}")
    agreed = min(n for n, _ in found)
    return agreed if agreed >= storage.min_hit_pages else 0
