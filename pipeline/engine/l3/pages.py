"""One page's object between a pool and the store: where each unit's page lies in memory, the
byte ranges a read fills, the buffers a write sends, and the digests that check them.

Where every unit's page is contiguous bytes in host memory (host layouts layer_first and
page_first_direct, a CPU device pool) the store reads straight into the pool rows and writes
straight from them. Where a unit's page is rows of host memory a fixed pitch apart
(page_first's token-major rows: a token's layers side by side) a native read still lands
each row in place (`PageMap.native`); other moves go through a staging buffer laid out as the
payload, one torch copy per run of units, as they do for a CUDA device pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.crc_runs import CrcRuns
from pipeline.core.l3 import PageObject
from pipeline.core.model import Unit, by_pool_kind
from pipeline.engine.l3.stores.parts import Check, Range
from pipeline.engine.transfer.pools import DevicePool, HostPool

Runs = list[tuple[torch.Tensor, tuple[Unit, ...]]]
"""A page of some units as few pool tensors as the pool allows, each with its units."""


@dataclass(frozen=True)
class Rows:
    """Where one unit's page lies in a flat byte buffer: page p at `first + p * stride`, as
    rows of `row` bytes `pitch` apart (one run of `nbytes` where `row` is `nbytes`)."""

    buffer: int
    first: int
    stride: int
    nbytes: int
    row: int
    pitch: int

    @property
    def extent(self) -> int:
        """Bytes from a page's first byte to its last."""
        return (self.nbytes // self.row - 1) * self.pitch + self.row


def page_rows(page: torch.Tensor) -> tuple[int, int] | None:
    """(row bytes, pitch) of one unit's page in host memory: one run (row = pitch = its
    bytes), or rows of its last dimension a fixed pitch apart; None otherwise."""
    if page.is_contiguous():
        return page.nbytes, page.nbytes
    if page.dim() == 2 and page.stride(1) == 1 and page.stride(0) >= page.shape[1]:
        size = page.element_size()
        return page.shape[1] * size, page.stride(0) * size
    return None


class Placement:
    """Where the pages of a pool's units lie as bytes: in the pool itself (direct), or, where
    some unit's page is not contiguous host memory, in a staging buffer (staged)."""

    def __init__(self, obj: PageObject, views: Mapping[int, torch.Tensor]) -> None:
        self.buffers: list[memoryview] = []
        self.addresses: list[int] = []
        """Where each buffer starts in memory."""
        self.rows: dict[int, Rows] = {}
        found: dict[int, int] = {}
        for unit in obj.units:
            view = views.get(unit.ordinal)
            if view is None:
                continue
            rows = page_rows(view[0]) if view.device.type == "cpu" and view.shape[0] else None
            if rows is None:
                self.buffers, self.addresses, self.rows = [], [], {}
                break
            storage = view.untyped_storage()
            if storage.data_ptr() not in found:
                found[storage.data_ptr()] = len(self.buffers)
                whole = torch.empty(0, dtype=torch.uint8).set_(storage)
                self.buffers.append(whole.numpy().data.cast("B"))
                self.addresses.append(storage.data_ptr())
            self.rows[unit.ordinal] = Rows(
                found[storage.data_ptr()],
                view.data_ptr() - storage.data_ptr(),
                view.stride(0) * view.element_size(),
                unit.page_bytes,
                *rows,
            )
        self.native = bool(self.rows)
        """A native read lands each page's bytes straight in the pool, row by row."""
        self.direct = self.native and all(r.row == r.nbytes for r in self.rows.values())
        """Every page is one run of bytes in the pool: any read or write moves it straight."""


class PageMap:
    """Where one set of units of a page lies in one pool, laid out once, so that a page's
    reads, writes and checks are a few list comprehensions."""

    def __init__(self, obj: PageObject, units: tuple[Unit, ...], placement: Placement) -> None:
        self.units = units
        self.payload = [obj.offsets[u.ordinal] for u in units]
        """Each unit's offset in the payload."""
        self.rows = [obj.index[u.ordinal] for u in units]
        """Each unit's row in the header's digest table."""
        groups = _groups(self.payload, [u.page_bytes for u in units])
        if not groups or groups[0][0] != 0:
            groups.insert(0, (0, []))
        self.groups = groups
        """Runs of units adjacent in the payload: one read call each; the first starts at the
        payload and is read with the header, in one call (a whole object is one call: a call
        per unit, or per 256 KiB that the CPU's cache would still hold, made the reads
        slower, each call being a turn of Python's lock)."""
        self.sizes = [[units[j].page_bytes for j in at] for _, at in groups]
        """Each group's units' sizes, in order."""
        self.totals = [sum(sizes) for sizes in self.sizes]
        """Each group's bytes."""
        self.direct, self.native = placement.direct, placement.native
        rows = [placement.rows[u.ordinal] for u in units] if self.native else []
        self._where = [(placement.buffers[r.buffer], r.first, r.stride, r.nbytes) for r in rows]
        self.first = np.array([placement.addresses[r.buffer] + r.first for r in rows], np.uint64)
        """Where each unit's page 0 lies in memory (native placements)."""
        self.stride = np.array([r.stride for r in rows], np.uint64)
        self.nbytes = np.array([u.page_bytes for u in units], np.int64)
        self.row = np.array([0 if r.row == r.nbytes else r.row for r in rows], np.int64)
        """Each unit's row bytes where its page is rows apart in the pool (0: one run)."""
        self.pitch = np.array([r.pitch for r in rows], np.int64)
        extents = [(placement.buffers[r.buffer].nbytes - r.first, r.extent, r.stride) for r in rows]
        self.held = min(((b - e) // s + 1 for b, e, s in extents), default=0)
        """Pages every unit's rows hold in the pool: a native read's address bound."""
        self._spans = _spans(self._where, groups) if self.direct else None

    def views(self, page: int) -> list[memoryview]:
        """Each unit's bytes of `page` in the pool (direct placements only)."""
        return [buf[f + page * s : f + page * s + n] for buf, f, s, n in self._where]

    def spans(self, page: int) -> list[memoryview] | None:
        """Each group's bytes of `page` in the pool as one buffer, where every group's units
        lie end to end there as in the payload (page_first_direct); None otherwise."""
        if self._spans is None:
            return None
        return [buf[f + page * s : f + page * s + n] for buf, f, s, n in self._spans]


def unit_columns(
    pages: PageMap, heads: np.ndarray, into: np.ndarray, *, skip: int
) -> tuple[np.ndarray, ...]:
    """(offsets, addresses, lengths, row bytes, pitches) of each page's reads of `pages`'
    units, a row per page (the objects' headers `heads` bytes long), after `skip` columns
    left for the caller."""
    count, per = len(heads), len(pages.units) + skip
    if count and not 0 <= int(np.min(into)) <= int(np.max(into)) < pages.held:
        raise IndexError(f"host pages {np.min(into)}-{np.max(into)} not in a pool of {pages.held}")
    offsets, addresses = np.empty((count, per), np.int64), np.empty((count, per), np.uint64)
    nbytes, rows, pitches = (np.empty((count, per), np.int64) for _ in range(3))
    offsets[:, skip:] = heads[:, None] + np.asarray(pages.payload, np.int64)
    addresses[:, skip:] = pages.first + np.asarray(into, np.uint64)[:, None] * pages.stride
    nbytes[:, skip:] = pages.nbytes
    rows[:, skip:], pitches[:, skip:] = pages.row, pages.pitch
    return offsets, addresses, nbytes, rows, pitches


def _spans(
    where: list[tuple[memoryview, int, int, int]], groups: list[tuple[int, list[int]]]
) -> list[tuple[memoryview, int, int, int]] | None:
    """(buffer, first, stride, bytes) of each group's units as one run of memory, or None
    unless, on every page, each unit starts where the one before it ends."""
    found = []
    for _, at in groups:
        if not at:
            found.append((memoryview(b""), 0, 0, 0))
            continue
        buf, first, stride, total = where[at[0]]
        for j in at[1:]:
            b, f, s, n = where[j]
            if b is not buf or s != stride or f != first + total:
                return None
            total += n
        found.append((buf, first, stride, total))
    return found


def _groups(payload: list[int], sizes: list[int]) -> list[tuple[int, list[int]]]:
    """(payload offset, unit indices) per run of units adjacent in the payload."""
    found: list[tuple[int, list[int]]] = []
    end = -1
    for i, (at, size) in enumerate(zip(payload, sizes, strict=True)):
        if at != end:
            found.append((at, []))
        found[-1][1].append(i)
        end = at + size
    return found


def pool_runs(pool: DevicePool | HostPool, units: tuple[Unit, ...], page: int) -> Runs:
    """A page of `units`, as few pool tensors as the pool allows (each run of one pool kind
    that its buffer stacks is one), each with its units."""
    found: Runs = []
    for run in by_pool_kind(units):
        stack = pool.stacked(run) if len(run) > 1 else None
        if stack is None:
            found.extend((pool.words[u.ordinal][page], (u,)) for u in run)
        else:
            found.append((stack[:, page], run))
    return found


def copy_runs(sources: Sequence[torch.Tensor], targets: Runs) -> None:
    """One torch copy per run (outside Python's lock)."""
    for source, (target, _) in zip(sources, targets, strict=True):
        target.copy_(source)


GroupCheck = Callable[[int, list[int]], bool]
"""Whether group i of a read holds what the header's digest table says."""


def unit_checks(
    pages: PageMap, views: list[memoryview], digest: Callable[[memoryview], int]
) -> tuple[list[list[memoryview]], GroupCheck]:
    """Each group's buffers as one view per unit, each unit checked by its own digest."""
    groups, rows = pages.groups, pages.rows

    def ok(i: int, table: list[int]) -> bool:
        return all(digest(views[j]) == table[rows[j]] for j in groups[i][1])

    return [[views[j] for j in at] for _, at in groups], ok


def span_checks(
    pages: PageMap, spans: list[memoryview], runs_crc: CrcRuns
) -> tuple[list[list[memoryview]], GroupCheck]:
    """Each group's buffers as one span, checked by one CRC against the CRC that its units'
    own CRCs combine to."""
    groups, rows, sizes = pages.groups, pages.rows, pages.sizes

    def ok(i: int, table: list[int]) -> bool:
        at = groups[i][1]
        return not at or runs_crc.check(spans[i], [table[rows[j]] for j in at], sizes[i])

    return [[span] if span.nbytes else [] for span in spans], ok


def page_ranges(head_bytes: int, pages: PageMap, buffers: list[list[memoryview]]) -> list[Range]:
    """Where each group's `buffers` lie in the object: after a header of `head_bytes`."""
    return [(head_bytes + at, bufs) for (at, _), bufs in zip(pages.groups, buffers, strict=True)]


HEADER = -1
"""In `read_checked`'s failed ranges: the header failed its own check."""


def read_checked(
    head: memoryview,
    pages: PageMap,
    header: Callable[[], list[int] | None],
    buffers: list[list[memoryview]],
    group_ok: GroupCheck,
    table: list[int],
) -> tuple[list[Range], Check, list[int]]:
    """The byte ranges of one page's read (the header with the first group, then one range
    per group's `buffers`), the check of each range as it lands (the header's own check and
    its digest table first, then `group_ok` of each group), and the ranges that landed and
    failed their check, as they do (`HEADER` for the header's own check: an object not made
    with this key, or a damaged header; a group's index: a corrupt payload). An empty `table`
    is filled from the header; a known one (a streamed load's later group of layers, read
    after its first) is checked against without reading the header again."""
    ranges = page_ranges(head.nbytes, pages, buffers)
    known = bool(table)
    if not known:
        ranges[0] = (0, [head, *ranges[0][1]])  # the header and the first units: one read
    failed: list[int] = []

    def check(i: int) -> bool:
        if not i and not known:
            found = header()
            if found is None:
                failed.append(HEADER)
                return False
            table.extend(found)
        ok = group_ok(i, table)
        failed.extend(() if ok else (i,))
        return ok

    return ranges, check, failed
