"""The buffers a blob is written from and read into."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import crc32c
import numpy as np

Part: TypeAlias = bytes | bytearray | memoryview
"""A buffer a blob is written from (a header, or a page's bytes in host memory)."""
IOV_MAX = 1024
"""The most buffers one readv/writev takes (Linux)."""


def part_bytes(part: Part) -> int:
    """A part's bytes, without a new view of it (a batch has a part a unit of each page)."""
    return part.nbytes if isinstance(part, memoryview) else len(part)


Range: TypeAlias = tuple[int, Sequence[memoryview]]
"""Where in a blob a read starts, and the buffers its bytes fill in order from there."""
Check: TypeAlias = Callable[[int], bool]
"""Called with each range's index once its buffers are filled (while they are still in the
CPU's cache); False ends the read as a miss."""

PartRead: TypeAlias = tuple[str, int, Sequence[Range], Check]
"""A read of some ranges of one object: (name, its size, the ranges, their check), as
`ObjectStore.read` takes them."""


@dataclass(frozen=True)
class SpanReads:
    """One byte range of each of many objects, each into one buffer and checked by one
    CRC-32C (a streamed load's later group of layers, for a run of pages): the reads of a
    batch, made without a Python call per range beyond the read and its CRC."""

    names: Sequence[str]
    sizes: Sequence[int]
    """Each object's size (a read of an object of another size is a miss)."""
    offsets: Sequence[int]
    views: Sequence[memoryview]
    crcs: Sequence[int]
    """The CRC-32C each range's bytes must have."""

    def part_reads(self) -> list[PartRead]:
        """The same reads as `PartRead`s (for a store that batches those its own way)."""
        return [
            (name, size, [(offset, [view])], functools.partial(span_ok, view, crc))
            for name, size, offset, view, crc in zip(
                self.names, self.sizes, self.offsets, self.views, self.crcs, strict=True
            )
        ]


@dataclass(frozen=True)
class UnitReads:
    """Byte ranges of many objects, every range into memory at an address (pool rows, a header
    buffer) with its CRC-32C taken as it lands: a load's reads in one call
    (`UnitsReader.read_units`) on `threads` threads of its own, made without a Python step per
    range. The ranges go in groups (a load's windows of pages, or a streamed load's groups of
    layers), each group's objects in order, once each; whether the CRCs match is the caller's
    to check, group by group (`on_group`)."""

    names: Sequence[str]
    sizes: Sequence[int]
    """Each object's size (an object of another size is a miss)."""
    objects: np.ndarray
    """int64: which of `names` each range reads."""
    offsets: np.ndarray
    """int64: each range's offset in its object."""
    addresses: np.ndarray
    """uint64: where each range's bytes land (memory the caller keeps alive and owns)."""
    nbytes: np.ndarray
    """int64: each range's length."""
    crcs: np.ndarray
    """uint32, filled: each range's CRC-32C."""
    starts: bool
    """The reads start at each object (its header): it is marked used (eviction order)."""
    ends: np.ndarray
    """int64: where each group of ranges ends (the last at the number of ranges)."""
    threads: int
    """How many threads read (the tier's I/O threads)."""
    on_group: Callable[[int], bool] | None = None
    """Called with group g's index once its ranges are whole (groups in order, from the
    calling thread, holding Python's lock); False stops the reads."""
    rows: np.ndarray | None = None
    """int64: where a range lands as rows a pitch apart, each row's bytes (0: one run)."""
    pitches: np.ndarray | None = None
    """int64: bytes from one row's start to the next's, where `rows` says rows."""


def span_ok(view: memoryview, crc: int, _: int) -> bool:
    return bool(crc32c.crc32c(view) == crc)


def advance(views: list[memoryview], done: int) -> list[memoryview]:
    """`views` without their first `done` bytes."""
    while views and done >= views[0].nbytes:
        done -= views[0].nbytes
        views = views[1:]
    return [views[0][done:], *views[1:]] if views and done else views


def bytes_views(parts: Sequence[Part]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]


def copy_out(staging: np.ndarray, ranges: Sequence[Range], check: Check | None) -> bool:
    """Fill each range's buffers from a staging buffer that holds the whole object, calling
    `check` after each (numpy copies run outside Python's lock); False once a check fails."""
    for i, (offset, buffers) in enumerate(ranges):
        at = offset
        for view in buffers:
            np.frombuffer(view, np.uint8)[:] = staging[at : at + view.nbytes]
            at += view.nbytes
        if check is not None and not check(i):
            return False
    return True


def read_ranges(fd: int, ranges: Sequence[Range], check: Check | None) -> bool:
    """Read each range from the file open at `fd` into its buffers (one scattering read per
    IOV_MAX buffers, however partial), checking each as it lands; False at a short file or a
    failed check."""
    for i, (offset, buffers) in enumerate(ranges):
        whole = not buffers or (
            len(buffers) <= IOV_MAX and os.preadv(fd, buffers, offset) == nbytes(buffers)
        )
        if not whole and not read_rest(fd, offset, buffers):  # partial, or > IOV_MAX buffers
            return False
        if check is not None and not check(i):
            return False
    return True


def nbytes(buffers: Sequence[memoryview]) -> int:
    return sum(v.nbytes for v in buffers)


def read_rest(fd: int, offset: int, buffers: Sequence[memoryview]) -> bool:
    """One range read again from its start, one scattering read at a time until it is
    whole; False at the end of the file."""
    views, at = list(buffers), offset
    while views:
        got = os.preadv(fd, views[:IOV_MAX], at)
        if got == 0:
            return False
        at += got
        views = advance(views, got)
    return True
