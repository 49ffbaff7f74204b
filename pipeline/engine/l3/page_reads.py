"""A run of whole pages read in one store call (`UnitsReader.read_units`) and checked: each
object's header and units straight into the host pool's rows, each unit's CRC-32C taken
natively as it lands, the headers' digest tables compared in bulk group by group. The
engine's loads read through it (`pipeline.engine.l3.batch`), and so does SGLang's backend
(`pipeline.integrations.sglang.objects`): anything that names objects by key (`Objects`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from pipeline.core.l3 import Checks, PageObject
from pipeline.core.l3_rows import header_rows
from pipeline.engine.l3.pages import PageMap, unit_columns
from pipeline.engine.l3.stores import UnitReads


class Objects(Protocol):
    """The objects a batch reads, by key (an `L3Tier`; SGLang's backend's `PageIO`)."""

    object: PageObject
    space: str
    checks: Checks

    def name(self, key: str) -> str: ...


class PageReads:
    """A run of pages read whole: each object's header and the units of `pages` into host
    pages `into`, in one call on `threads` threads, the units checked against the header's
    digest table (kept in the empty `tables[i]`), group by group of pages; `corrupt` is
    called where a page read whole fails its check."""

    def __init__(
        self,
        objects: Objects,
        pages: PageMap,
        keys: Sequence[str],
        into: np.ndarray,
        tables: Sequence[list[int]],
        threads: int,
        corrupt: Callable[[], None],
    ) -> None:
        self.objects, self.tables, self.count = objects, tables, len(keys)
        self.pages, self.per = pages, len(pages.units) + 1
        self.threads, self.corrupt = threads, corrupt
        self.names, heads = named(objects, keys)  # a range for the header, then the units'
        self.heads = heads  # the headers' lengths
        width = int(heads.max()) if self.count else 0
        self.head_rows = np.empty((self.count, width), np.uint8)  # kept alive until read
        columns = unit_columns(self.pages, heads, into, skip=1)
        offsets, addresses, nbytes, row, pitch = columns
        offsets[:, 0] = 0
        addresses[:, 0] = (
            self.head_rows.ctypes.data + np.arange(self.count, dtype=np.uint64) * width
        )
        nbytes[:, 0] = heads
        row[:, 0] = pitch[:, 0] = 0
        self.columns = tuple(column.ravel() for column in columns)
        self.crcs = np.empty((self.count, self.per), np.uint32)
        self.sizes = (heads + objects.object.page_bytes).tolist()

    def reads(self, bounds: Sequence[int], on_group: Callable[[int], bool] | None) -> UnitReads:
        """The reads, in groups of pages [bounds[g], bounds[g + 1])."""
        offsets, addresses, nbytes, rows, pitches = self.columns
        return UnitReads(
            self.names,
            self.sizes,
            np.repeat(np.arange(self.count), self.per),
            offsets,
            addresses,
            nbytes,
            self.crcs.ravel(),
            starts=True,
            ends=np.asarray(bounds[1:], np.int64) * self.per,
            threads=self.threads,
            on_group=on_group,
            rows=rows,
            pitches=pitches,
        )

    def intact(self, first: int, stop: int) -> int:
        """How many of pages [first, stop), read whole, are intact from the first."""
        if stop <= first:
            return 0
        objects, rows, names = self.objects, self.head_rows[first:stop], self.names[first:stop]
        ok, digests = header_rows(rows, objects.object, objects.space, names, objects.checks)
        headed = int(np.argmin(ok)) if not ok.all() else stop - first
        for table, row in zip(self.tables[first : first + headed], digests.tolist(), strict=False):
            table.extend(row)
        wanted = digests[:headed][:, self.pages.rows]
        intact = leading_intact(self.crcs[first : first + headed, 1:], wanted)
        if intact < stop - first:
            self.corrupt()  # there at its size, and not what its header says
        return intact


def named(objects: Objects, keys: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The objects of `keys`: their names, and their headers' lengths (int64)."""
    names = [objects.name(key) for key in keys]
    heads = [objects.object.header_size(objects.space, n, objects.checks) for n in names]
    return names, np.array(heads, np.int64)


def leading_intact(crcs: np.ndarray, wanted: np.ndarray) -> int:
    """Rows, from the first, whose every CRC is the one wanted."""
    bad = np.flatnonzero((crcs != wanted).any(axis=1))
    return int(bad[0]) if len(bad) else len(crcs)
