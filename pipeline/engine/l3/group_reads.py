"""A streamed load's later groups of layers read natively: every page's ranges of each
group, group after group, in one store call, each group checked against the digest tables
its pages' first group read (`pipeline.engine.l3.load`). The fetch's own call reads them on
after the first group (`pipeline.engine.l3.batch`); a load whose hits were cut short reads
them in a call of their own (`pipeline.engine.l3.runs`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from pipeline.core.model import Unit
from pipeline.engine.l3.jobs import ObjectsJob
from pipeline.engine.l3.page_reads import leading_intact, named
from pipeline.engine.l3.pages import unit_columns
from pipeline.engine.l3.stores import UnitReads, UnitsReader
from pipeline.engine.l3.tier import L3Tier


class GroupReads:
    """The ranges of a streamed load's later groups for a run of pages, group after group,
    and each group's check against the tables its pages' first group read (they may still
    be filling when this is made: they are read at the first check); `objects`: the pages'
    names and their headers' lengths (`named`)."""

    def __init__(
        self,
        tier: L3Tier,
        objects: tuple[list[str], np.ndarray],
        into: np.ndarray,
        tables: Sequence[list[int]],
        groups: Sequence[tuple[Unit, ...]],
    ) -> None:
        self.names, self.heads = objects
        self.count, self.size, self.tables = len(self.names), tier.object.page_bytes, tables
        self.maps = [tier.page_map(units, device=False) for units in groups]
        self.columns = [unit_columns(pages, self.heads, into, skip=0) for pages in self.maps]
        self.wanted: list[np.ndarray] = []
        self.ends = np.cumsum([self.count * len(pages.units) for pages in self.maps])
        self.crcs = np.empty(int(self.ends[-1]), np.uint32)
        self.threads = tier.storage.io_threads

    def start(self, g: int) -> int:
        return int(self.ends[g - 1]) if g else 0

    def intact(self, g: int, pages: int | None = None) -> int:
        """Group g's leading intact pages (among its first `pages`)."""
        if not self.wanted:
            tables = np.array(self.tables, np.uint64).reshape(self.count, -1)
            self.wanted = [tables[:, pages.rows] for pages in self.maps]
        got = self.crcs[self.start(g) : self.ends[g]].reshape(self.count, -1)
        return leading_intact(got[:pages], self.wanted[g][:pages])

    def read_whole(self, g: int, done: int) -> int:
        """Group g's pages read whole when the reads stopped after `done` ranges."""
        return max(0, done - self.start(g)) // len(self.maps[g].units)

    def reads(self, on_group: Callable[[int], bool] | None) -> UnitReads:
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


def group_read(
    tier: L3Tier, plan: GroupReads, futures: list[Future[int]], running: list[int], g: int
) -> bool:
    """Later group g is whole: check it, resolve its future, and say whether to read on
    (every page intact and the next group still wanted)."""
    found = plan.intact(g)
    if found < plan.count and tier.store.exists([plan.names[found]]) == [True]:
        tier.trace.op("l3_corrupt")  # there, and not what its first group's header said
    futures[g].set_result(found)
    running[0] = g + 1
    more = found == plan.count and g + 1 < len(futures)
    return more and futures[g + 1].set_running_or_notify_cancel()


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
    job, running = jobs[0], [0]  # the group being read
    keys, into, tables = job.keys[first:stop], job.host_pages[first:stop], job.tables[first:stop]
    plan = GroupReads(tier, named(tier, keys), into, tables, [j.units for j in jobs])
    if futures[0].set_running_or_notify_cancel():
        try:
            done = reader.read_units(
                plan.reads(lambda g: group_read(tier, plan, futures, running, g))
            )
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
