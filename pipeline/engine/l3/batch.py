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

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import NamedTuple

import numpy as np

from pipeline.core.model import Unit
from pipeline.engine.l3.group_reads import GroupReads, group_read
from pipeline.engine.l3.jobs import Run
from pipeline.engine.l3.page_reads import PageReads
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


class Started(NamedTuple):
    """A fetch's store call: its runs of pages of the first group (a window each, read
    intact from the first), a future per later group (its pages read intact, from the
    first) and the call's own task."""

    runs: list[Run]
    groups: list[Future[int]]
    task: Future[None]


def start_batches(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: list[str],
    into: np.ndarray,
    tables: list[list[int]],
    later: Sequence[tuple[Unit, ...]] = (),
) -> Started:
    """Read the pages `into` in one store call, a task on the I/O threads that reads on the
    tier's I/O thread count of its own (the fetch's windows its groups), then, in the same
    call, the `later` groups of layers of every page (checked against the tables the first
    read filled). A window or later group whose future was cancelled (a drained fetch) and
    those after it read nothing."""
    groups: list[Future[int]] = [Future() for _ in later]
    call = FetchCall(tier, units, keys, into, tables, later, groups)
    task = tier.io.submit(call.run)
    bounds = call.bounds
    return Started(list(zip(bounds, bounds[1:], call.futures, strict=False)), groups, task)


class FetchCall:
    """A fetch's one store call: the first group's pages window by window (each window's
    future resolved as it is whole and checked), then the later groups' (`GroupReads`)."""

    def __init__(
        self,
        tier: L3Tier,
        units: tuple[Unit, ...],
        keys: list[str],
        into: np.ndarray,
        tables: list[list[int]],
        later: Sequence[tuple[Unit, ...]],
        groups: list[Future[int]],
    ) -> None:
        self.tier, self.units, self.keys, self.into, self.tables = tier, units, keys, into, tables
        self.later, self.groups = later, groups
        # a streamed fetch's first group is agreed on at once (no window of it is loaded
        # before the rest): one turn of Python's lock for it, not one a window
        count, window = len(keys), (not later and tier.window_pages) or len(keys)
        self.bounds = [*range(0, count, window), count]
        self.futures: list[Future[int]] = [Future() for _ in self.bounds[1:]]
        self.settled, self.running = 0, [0]  # the windows resolved; the later group being read
        self.plan: PageReads  # the first group's reads, made on the I/O thread (`read`)
        self.rest: GroupReads | None = None

    def run(self) -> None:
        futures, groups, running = self.futures, self.groups, self.running
        try:
            if futures and self.window_wanted(0):
                self.read()
        except BaseException as e:
            for future in futures[self.settled :]:
                if future.running():
                    future.set_exception(e)
            if running[0] < len(groups) and groups[running[0]].running():
                groups[running[0]].set_exception(e)
                running[0] += 1
        for future in futures[self.settled :]:  # after a miss, a failure or a cancel
            if future.running() or future.set_running_or_notify_cancel():
                future.set_result(0)
        for group in groups[running[0] :]:
            if group.set_running_or_notify_cancel():
                group.set_result(0)

    def read(self) -> None:
        tier, bounds, groups, running = self.tier, self.bounds, self.groups, self.running
        self.plan = plan = tier_reads(tier, self.units, self.keys, self.into, self.tables)
        if self.later:
            objects = (plan.names, plan.heads)  # named once for both
            self.rest = GroupReads(tier, objects, self.into, self.tables, self.later)
            reads = one_call(plan, bounds, self.on_group, self.rest)
        else:
            reads = plan.reads(bounds, self.on_group)
        reader = tier.store.units_reader()
        assert reader is not None, "batched() asked the store"
        try:
            done = reader.read_units(reads)
        finally:
            reader.close()
        w = self.settled
        if w < len(self.futures) and self.futures[w].running():  # cut short
            whole = min(done, plan.crcs.size) // plan.per  # pages read whole
            self.resolve(plan.intact(bounds[w], whole))
        elif self.rest and running[0] < len(groups) and groups[running[0]].running():
            g, done = running[0], done - plan.crcs.size
            groups[g].set_result(self.rest.intact(g, self.rest.read_whole(g, done)))
            running[0] += 1

    def resolve(self, intact: int) -> None:
        self.futures[self.settled].set_result(intact)
        self.settled += 1

    def window_wanted(self, w: int) -> bool:  # window w's future, still wanted
        return self.futures[w].set_running_or_notify_cancel()

    def on_group(self, g: int) -> bool:
        bounds, groups = self.bounds, self.groups
        if g >= len(bounds) - 1:  # a later group's
            assert self.rest is not None, "later groups come with their reads"
            return group_read(self.tier, self.rest, groups, self.running, g - len(bounds) + 1)
        intact = self.plan.intact(bounds[g], bounds[g + 1])
        self.resolve(intact)
        whole = intact == bounds[g + 1] - bounds[g]
        if g + 2 < len(bounds):
            return whole and self.window_wanted(g + 1)
        return whole and bool(groups) and groups[0].set_running_or_notify_cancel()


def one_call(
    plan: PageReads, bounds: list[int], on_group: Callable[[int], bool], rest: GroupReads
) -> UnitReads:
    """`plan`'s reads (in windows `bounds`), then `rest`'s, as one call's: the CRCs land in
    one buffer, which both read theirs from."""
    crcs = np.empty(plan.crcs.size + rest.crcs.size, np.uint32)
    plan.crcs = crcs[: plan.crcs.size].reshape(plan.crcs.shape)
    rest.crcs = crcs[plan.crcs.size :]
    first, then = plan.reads(bounds, on_group), rest.reads(None)

    def both(column: str) -> np.ndarray:
        return np.concatenate([getattr(first, column), getattr(then, column)])

    return dataclasses.replace(
        first,
        objects=both("objects"),
        offsets=both("offsets"),
        addresses=both("addresses"),
        nbytes=both("nbytes"),
        crcs=crcs,
        ends=np.concatenate([first.ends, then.ends + plan.crcs.size]),
        rows=both("rows"),
        pitches=both("pitches"),
    )


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
