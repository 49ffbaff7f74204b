"""Objects kept in Mooncake as pieces, cut where a streamed load's groups of layers start.

Mooncake gets whole objects about twice as fast as ranges of them (BENCHMARKS.md, L3), so a
load that reads a page's layers a group at a time (`l3.load.stream_from_l3`) is slow on one
object a page. Whoever opens a space's objects over a store tells it where their payloads are
cut (`ObjectStore.cut`: the same places for every writer and reader of the space,
`l3.groups.piece_cuts`; the header, whose length differs by share and checks, goes with the
first piece). Mooncake then keeps each piece as an object of its own, named
`<name>@<the cuts' tag>.<k>`, and a group's reads are whole gets of its pieces; a read maps
each range to the pieces that hold it. Pieces cut elsewhere carry another tag, so they are
not found: a miss, never wrong bytes. A name of a space with no cuts is one object.
"""

from __future__ import annotations

import bisect
import itertools
import zlib
from collections.abc import Sequence

import numpy as np

from pipeline.engine.l3.stores.parts import Check, Part, PartRead, Range, UnitReads, bytes_views

PAD = 64
"""Bytes every piece after the first starts with, read by no one: its units then lie 64 bytes
past a 4 KiB boundary of the client's buffer, not at one as the pool's rows do, and a copy
between addresses a multiple of 4 KiB apart runs slow (4K aliasing: docs/l3.md)."""
PADDING = memoryview(bytes(PAD))


def lead(piece: int) -> int:
    """Bytes before a piece's share of its object: PAD, but for the first."""
    return PAD if piece else 0


def space_of(name: str) -> str:
    """The space an object's name starts with (`PageObject.name`: `<space>/<xx>/<key>`)."""
    return name.split("/", 1)[0]


class Pieces:
    """Where each space's objects are cut (see the module)."""

    def __init__(self) -> None:
        self.layouts: dict[str, tuple[str, tuple[int, ...]]] = {}
        """Per space: its layout's tag, and its payload's bounds (0, each cut, its size)."""

    def cut(self, space: str, payload_bytes: int, cuts: Sequence[int]) -> None:
        """Keep `space`'s objects in pieces from each of `cuts` on: offsets in the payload of
        `payload_bytes` that ends each object (its header, before it, goes with the first)."""
        bounds = (0, *sorted(set(cuts) - {0}), payload_bytes)
        if len(bounds) == 2:
            return  # one piece: the whole object
        if np.any(np.diff(bounds) <= 0):
            raise ValueError(f"cuts {list(cuts)} do not lie inside a payload of {payload_bytes} B")
        tag = f"{zlib.crc32(repr(bounds).encode()):08x}"  # in the pieces' names
        if self.layouts.setdefault(space, (tag, bounds)) != (tag, bounds):
            raise ValueError(f"{space}'s payloads are cut at {self.layouts[space][1][1:-1]}")

    def of(self, name: str, size: int) -> tuple[int, ...] | None:
        """Where in a blob of `size` under `name` each of its pieces' shares starts, and its
        size; None: whole (a space not cut, or a blob no longer than its payloads). Each
        piece after the first is PAD bytes longer than its share."""
        layout = self.layouts.get(space_of(name))
        if layout is None or size <= layout[1][-1]:
            return None
        head = size - layout[1][-1]
        return (0, *(head + b for b in layout[1][1:]))

    def sizes(self, name: str, size: int) -> list[int]:
        """Each object a blob of `size` under `name` is kept as, its size (with its PAD)."""
        bounds = self.of(name, size) or (0, size)
        return [b - a + lead(k) for k, (a, b) in enumerate(itertools.pairwise(bounds))]

    def names(self, name: str) -> list[str]:
        """The pieces `name` is kept in where its space is cut, else [name]."""
        layout = self.layouts.get(space_of(name))
        if layout is None:
            return [name]
        return [f"{name}@{layout[0]}.{k}" for k in range(len(layout[1]) - 1)]

    def forms(self, name: str) -> list[str]:
        """Every object `name` may be kept as: itself (any blob where its space is not cut,
        else one no longer than its payloads), then its pieces."""
        pieces = self.names(name)
        return pieces if pieces == [name] else [name, *pieces]

    def stale(self, name: str, kept: Sequence[str]) -> list[str]:
        """The forms of `name` a blob kept as `kept` replaces."""
        return [form for form in self.forms(name) if form not in kept]

    def reads(self, read: tuple[str, int, Sequence[Range], Check | None]) -> list[PartRead]:
        """`read` as reads of the objects it is kept as (itself, where whole): each range's
        bytes from the pieces that hold them, in the pieces' order, its check called with
        the last of them."""
        name, size, ranges, check = read
        bounds = self.of(name, size)
        if bounds is None:
            return [(name, size, ranges, checking(check, list(range(len(ranges)))))]
        split: dict[int, tuple[list[Range], list[int | None]]] = {}
        for i, (offset, buffers) in enumerate(ranges):
            spans = cut_range(bounds, offset, buffers)
            for j, (piece, at, views) in enumerate(spans):
                piece_ranges, checked = split.setdefault(piece, ([], []))
                piece_ranges.append((at - bounds[piece] + lead(piece), views))
                checked.append(i if j == len(spans) - 1 else None)
        names = self.names(name)
        return [
            (names[p], bounds[p + 1] - bounds[p] + lead(p), rs, checking(check, checked))
            for p, (rs, checked) in sorted(split.items())
        ]

    def expand(self, reads: Sequence[PartRead]) -> tuple[list[PartRead], list[int]]:
        """Each of `reads` as `Pieces.reads` makes it, end to end, and how many of
        `reads` are whole once the first k of those are, for each k up to their count."""
        if not self.layouts:  # nothing cut: the reads as they are, no Python a read
            return list(reads), [*range(len(reads)), len(reads)]
        kept = [self.reads(read) for read in reads]
        owners = [i for i, pieces in enumerate(kept) for _ in pieces]
        return [piece for pieces in kept for piece in pieces], [*owners, len(reads)]

    def parts(self, name: str, parts: Sequence[Part]) -> list[tuple[str, list[memoryview]]]:
        """(object, buffers) of each object a blob written from `parts` is kept as."""
        views = bytes_views(parts)
        bounds = self.of(name, sum(v.nbytes for v in views))
        if bounds is None:
            return [(name, views)]
        names = self.names(name)
        return [(names[p], [PADDING, *vs] if p else vs) for p, _, vs in cut_range(bounds, 0, views)]

    def units(self, reads: UnitReads) -> tuple[UnitReads, np.ndarray]:
        """`reads` as reads of the objects they are kept as, and which of `reads.names` each
        of those is. A range must lie in one piece (a unit, or a header, never spans a cut);
        the ranges, their order, CRCs and groups stay as they are."""
        if not self.layouts:  # nothing cut: no Python a page
            return reads, np.arange(len(reads.names))
        kept = [self.of(n, s) for n, s in zip(reads.names, reads.sizes, strict=True)]
        if all(bounds is None for bounds in kept):
            return reads, np.arange(len(reads.names))
        bounds = [b or (0, s) for b, s in zip(kept, reads.sizes, strict=True)]
        names = [
            piece
            for name, b in zip(reads.names, kept, strict=True)
            for piece in (self.names(name) if b is not None else [name])
        ]
        base = np.concatenate([[0], np.cumsum(reads.sizes)[:-1]])  # the objects end to end
        starts = np.concatenate([np.asarray(b[:-1]) + base[o] for o, b in enumerate(bounds)])
        ends = np.concatenate([np.asarray(b[1:]) + base[o] for o, b in enumerate(bounds)])
        at = base[reads.objects] + reads.offsets
        piece = np.searchsorted(starts, at, "right") - 1
        if np.any(at + reads.nbytes > ends[piece]):
            raise ValueError("a range spans a cut between an object's pieces")
        owners = np.repeat(np.arange(len(bounds)), [len(b) - 1 for b in bounds])
        leads = np.where(np.diff(owners, prepend=-1) != 0, 0, PAD)  # but an object's first
        cut = UnitReads(
            names, (ends - starts + leads).tolist(), piece, at - starts[piece] + leads[piece],
            reads.addresses,
            reads.nbytes, reads.crcs, starts=reads.starts, ends=reads.ends,
            threads=reads.threads, on_group=reads.on_group, rows=reads.rows,
            pitches=reads.pitches,
        )  # fmt: skip
        return cut, owners


def cut_range(
    bounds: Sequence[int], offset: int, buffers: Sequence[memoryview]
) -> list[tuple[int, int, list[memoryview]]]:
    """(piece, offset in the object, buffers) of each piece a range's bytes fall in, in order:
    a buffer across a cut split there."""
    found: list[tuple[int, int, list[memoryview]]] = []
    at = offset
    for view in buffers:
        while view.nbytes:
            piece = bisect.bisect_right(bounds, at) - 1
            take = min(view.nbytes, bounds[piece + 1] - at) if piece + 1 < len(bounds) else 0
            if take <= 0:
                raise ValueError(f"a range reaches past an object of {bounds[-1]} B")
            if not found or found[-1][0] != piece:
                found.append((piece, at, []))
            found[-1][2].append(view[:take])
            view, at = view[take:], at + take
    return found


def checking(check: Check | None, checked: list[int | None]) -> Check:
    """A piece's check: its j-th range ends the original range checked[j] (None: a range's
    first bytes, whose check waits for its last)."""

    def piece_check(j: int) -> bool:
        i = checked[j]
        return i is None or check is None or check(i)

    return piece_check
