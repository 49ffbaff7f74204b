"""A load's pages read in one store call (`UnitsReader.read_units`) on threads of its own:
each page's units straight into its host-pool rows, each unit's CRC-32C taken natively as it
lands, every header read in the same call where the digest tables are not known yet; the
digests are compared in bulk as each group of pages (a window, a group of layers) is whole.

Taken where the host pool holds each unit's page as bytes, in one run (host layouts
layer_first and page_first_direct) or as rows a pitch apart (page_first, where the store's
reader lands rows: the file store's), the check is CRC-32C
(a keyed check is a digest per unit in Python) and the store reads natively (a file store
through the page cache); elsewhere a page is a read of its own (`L3Tier.read`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from pipeline.core.model import Unit
from pipeline.engine.l3.jobs import ObjectsJob
from pipeline.engine.l3.page_reads import PageReads, leading_intact, named
from pipeline.engine.l3.pages import unit_columns
from pipeline.engine.l3.stores import UnitReads, UnitsReader
from pipeline.engine.l3.tier import L3Tier


def batched(tier: L3Tier, units: tuple[Unit, ...], *, device: bool) -> bool:
    """Whether reads of `units` into the host pool (not `device` pages) go in batches."""
    if device or not tier.reading.units or tier.runs_crc is None:
        return False
    pages = tier.page_map(units, device=False)
    return pages.direct or (pages.native and tier.reading.rows)


def lands_in_pool(tier: L3Tier, units: tuple[Unit, ...], *, device: bool) -> bool:
    """Whether reads of `units` land straight in the pool's rows (else through staging)."""
    return batched(tier, units, device=device) or tier.page_map(units, device=device).direct


def start_batches(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: list[str],
    into: np.ndarray,
    tables: list[list[int]],
) -> list[Future[bool]]:
    """Read the pages `into` in one store call, a task on the I/O threads that reads on the
    tier's I/O thread count of its own (the fetch's windows its groups); a future per page,
    True once it is read intact, resolved window by window. A window any of whose futures
    was cancelled (a drained fetch) and those after it read nothing."""
    futures: list[Future[bool]] = [Future() for _ in keys]
    tier.io.submit(_fetch, tier, units, keys, into, tables, futures)
    return futures


def _fetch(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: list[str],
    into: np.ndarray,
    tables: list[list[int]],
    futures: list[Future[bool]],
) -> None:
    count, window = len(keys), tier.window_pages or len(keys)
    bounds = [*range(0, count, window), count]
    settled = [0]  # the pages resolved

    def resolve(stop: int, intact: int) -> None:
        for i in range(settled[0], stop):
            futures[i].set_result(i < settled[0] + intact)
        settled[0] = stop

    def running(w: int) -> bool:  # window w's futures, all still wanted
        return all(f.set_running_or_notify_cancel() for f in futures[bounds[w] : bounds[w + 1]])

    def on_window(w: int) -> bool:
        intact = plan.intact(bounds[w], bounds[w + 1])
        resolve(bounds[w + 1], intact)
        return intact == bounds[w + 1] - bounds[w] and w + 2 < len(bounds) and running(w + 1)

    try:
        if count and running(0):
            plan = tier_reads(tier, units, keys, into, tables)
            reader = tier.store.units_reader()
            assert reader is not None, "batched() asked the store"
            try:
                done = reader.read_units(plan.reads(bounds, on_window)) // plan.per
            finally:
                reader.close()
            if settled[0] < count and futures[settled[0]].running():  # cut short by a read
                resolve(bounds[bounds.index(settled[0]) + 1], plan.intact(settled[0], done))
    except BaseException as e:
        for future in futures[settled[0] :]:
            if future.running():
                future.set_exception(e)
    for future in futures[settled[0] :]:  # after a miss, a failure or a cancel
        if future.running() or future.set_running_or_notify_cancel():
            future.set_result(False)


def read_batch(
    tier: L3Tier,
    reader: UnitsReader,
    units: tuple[Unit, ...],
    keys: Sequence[str],
    into: np.ndarray,
    tables: Sequence[list[int]],
) -> int:
    """The pages of `keys` read into host pages `into` in one `reader` call (`PageReads`);
    how many, from the first, were read intact."""
    plan = tier_reads(tier, units, keys, into, tables)
    done = reader.read_units(plan.reads([0, len(keys)], None)) // plan.per
    return plan.intact(0, done)


def tier_reads(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: Sequence[str],
    into: np.ndarray,
    tables: Sequence[list[int]],
) -> PageReads:
    """The tier's reads of `units` of the pages of `keys` into host pages `into`."""
    pages, threads = tier.page_map(units, device=False), tier.storage.io_threads
    return PageReads(tier, pages, keys, into, tables, threads, lambda: tier.trace.op("l3_corrupt"))


class GroupReads:
    """The ranges of a streamed load's later groups for a run of pages, group after group,
    and each group's check against the tables its pages' first group read."""

    def __init__(self, tier: L3Tier, jobs: list[ObjectsJob], first: int, stop: int) -> None:
        keys, into = jobs[0].keys[first:stop], jobs[0].host_pages[first:stop]
        self.count, self.size = len(keys), tier.object.page_bytes
        self.names, self.heads = named(tier, keys)
        tables = np.array(jobs[0].tables[first:stop], np.uint64).reshape(self.count, -1)
        self.maps = [tier.page_map(job.units, device=False) for job in jobs]
        self.columns = [unit_columns(pages, self.heads, into, skip=0) for pages in self.maps]
        self.wanted = [tables[:, pages.rows] for pages in self.maps]
        self.ends = np.cumsum([self.count * len(pages.units) for pages in self.maps])
        self.crcs = np.empty(int(self.ends[-1]), np.uint32)
        self.threads = tier.storage.io_threads

    def start(self, g: int) -> int:
        return int(self.ends[g - 1]) if g else 0

    def intact(self, g: int, pages: int | None = None) -> int:
        """Group g's leading intact pages (among its first `pages`)."""
        got = self.crcs[self.start(g) : self.ends[g]].reshape(self.count, -1)
        return leading_intact(got[:pages], self.wanted[g][:pages])

    def read_whole(self, g: int, done: int) -> int:
        """Group g's pages read whole when the reads stopped after `done` ranges."""
        return max(0, done - self.start(g)) // len(self.maps[g].units)

    def reads(self, on_group: Callable[[int], bool]) -> UnitReads:
        offsets, addresses, nbytes, rows, pitches = (
            np.concatenate([c[k].ravel() for c in self.columns]) for k in range(5)
        )
        per_page = [len(pages.units) for pages in self.maps]
        objects = np.concatenate([np.repeat(np.arange(self.count), n) for n in per_page])
        sizes = (self.heads + self.size).tolist()
        columns = {"offsets": offsets, "addresses": addresses, "nbytes": nbytes}
        return UnitReads(
            self.names,
            sizes,
            objects,
            **columns,
            crcs=self.crcs,
            starts=False,
            ends=self.ends,
            threads=self.threads,
            on_group=on_group,
            rows=rows,
            pitches=pitches,
        )


def read_groups(
    tier: L3Tier,
    reader: UnitsReader,
    jobs: list[ObjectsJob],
    futures: list[Future[int]],
    first: int,
    stop: int,
) -> None:
    """A streamed load's later groups `jobs` of pages [first, stop), in one `reader` call:
    every group's ranges, group after group, each group checked against the tables its
    pages' first group read as soon as it is whole (on this thread, a moment under Python's
    lock) and its future resolved with how many pages, from the first, are intact; a miss or
    a cancelled next future ends the reads, and every group not read resolves as none."""
    plan, running = GroupReads(tier, jobs, first, stop), [0]  # the group being read

    def on_group(g: int) -> bool:
        found = plan.intact(g)
        if found < plan.count and tier.store.exists([plan.names[found]]) == [True]:
            tier.trace.op("l3_corrupt")  # there, and not what its first group's header said
        futures[g].set_result(found)
        running[0] = g + 1
        more = found == plan.count and g + 1 < len(futures)
        return more and futures[g + 1].set_running_or_notify_cancel()

    if futures[0].set_running_or_notify_cancel():
        try:
            done = reader.read_units(plan.reads(on_group))
        except BaseException as e:
            if running[0] < len(futures) and futures[running[0]].running():
                futures[running[0]].set_exception(e)
                running[0] += 1
        else:
            g = running[0]
            if g < len(futures) and futures[g].running():  # cut short by a read
                futures[g].set_result(plan.intact(g, plan.read_whole(g, done)))
                running[0] += 1
    for later in futures[running[0] :]:  # the groups after a miss, a failure or a cancel
        if later.set_running_or_notify_cancel():
            later.set_result(0)
