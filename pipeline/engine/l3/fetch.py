"""A fetch's reads: started at once on the I/O threads, waited for window by window.

`ReadObjects` starts them, `AgreeOnHits` waits for each window's before the group agrees on
it, and whatever a miss left running is cancelled or waited for before the fetch returns, so
no thread writes into the fetch's pages after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, wait
from typing import Any

from pipeline.core.model import Unit
from pipeline.engine.l3.batch import batched, lands_in_pool, start_batches
from pipeline.engine.l3.jobs import ObjectsJob
from pipeline.engine.l3.tier import L3Tier


def read_units(tier: L3Tier, job: ObjectsJob) -> tuple[Unit, ...]:
    """The units a fetch reads of each page: every unit after a fallback, else the job's
    (a streamed load's group of layers) or this rank's."""
    return tier.reads(True) if job.fallback else job.units or tier.reads(False)


def start_reads(tier: L3Tier, job: ObjectsJob) -> None:
    """Start reading every page of the job on the I/O threads, in page order (this
    rank's units; every unit into device pages after a fallback): in runs of pages, a store
    call each, where the tier batches them (`pipeline.engine.l3.batch`), else a page a call."""
    units = read_units(tier, job)
    into = job.device_pages if job.fallback else job.host_pages
    assert into is not None, "a fetch names its device pages"
    tables = job.tables or [[] for _ in job.keys]
    if units and batched(tier, units, device=job.fallback):
        later = [] if job.fallback else job.later  # every unit already, after a fallback
        started = start_batches(tier, units, job.keys, into, tables, later)
        job.reads, job.later_reads, job.task = started
    elif units:
        job.reads = [
            (i, i + 1, tier.io.submit(read_page, tier, key, int(page), units, job.fallback, table))
            for i, (key, page, table) in enumerate(zip(job.keys, into, tables, strict=True))
        ]


def read_page(
    tier: L3Tier, key: str, page: int, units: tuple[Unit, ...], device: bool, table: list[int]
) -> int:
    """A page read in a call of its own: 1 if read intact, else 0 (a run of one page)."""
    return int(tier.read(key, page, units, device=device, table=table))


def settle(tier: L3Tier, job: ObjectsJob, first: int, stop: int, *, wait: bool = True) -> int:
    """Wait for the reads of pages [first, stop) (`wait=False`: take those done by now); the
    end of their leading intact run (`stop` for a rank that reads nothing)."""
    if not job.reads:
        return stop
    units = read_units(tier, job)
    nbytes = sum(u.page_bytes for u in units)
    into = "pool" if lands_in_pool(tier, units, device=job.fallback) else "staging"
    end, missed = first, False
    for start, end_of_run, read in job.reads:
        if end_of_run <= first:
            continue
        if start >= stop or (not wait and not read.done()):
            break
        assert start == end and end_of_run <= stop, "a fetch settles whole runs of its reads"
        end = start + read.result()
        if end < end_of_run:
            missed = True
            break
    # straight into pool rows, or not: an op a page, counted at once
    tier.trace.repeat("l3_read", end - first, bytes=nbytes, into=into)
    if missed:
        tier.trace.op("l3_miss")
    return end


def drain(job: ObjectsJob, *, keep_later: bool = False) -> None:
    """Cancel the reads not started and wait for the running ones, and for the native store
    call reading them (its ranges in flight land after the futures they belong to were
    cancelled; a call still queued is cancelled, so a busy I/O thread holds nothing up): no
    thread writes into the job's pages after the fetch, but for its later groups' reads where
    `keep_later` (every page a hit: they read into pages the load holds)."""
    cancel_or_wait([read for _, _, read in job.reads])
    job.reads = []
    if keep_later and job.later_reads:
        return  # the call reads on into the hit pages: the streamed load waits for it
    cancel_or_wait(job.later_reads)
    if job.task is not None and not job.task.cancel():
        wait([job.task])
    job.later_reads, job.task = [], None


def cancel_or_wait(reads: Sequence[Future[Any]]) -> None:
    """Cancel the reads not started and wait for the running ones."""
    # a cancelled read never runs; waiting for it would wait until a busy I/O thread reached
    # it in the queue (a slow reader would hold a best_effort load for as long)
    wait([future for future in reads if not future.cancel()])
