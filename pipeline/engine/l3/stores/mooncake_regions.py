"""Memory registered with a Mooncake client: where a get may land, or a put read from, with
no copy."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.engine.l3.stores.parts import Range


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)


class Regions:
    """The buffers registered with `client` (`register`), and a discard region of
    `discard_bytes` that a whole-object get puts the bytes no buffer asked for in."""

    def __init__(self, client: Any, discard_bytes: int) -> None:
        self.client = client
        self.spans: list[tuple[int, int]] = []
        """Registered (start, end) addresses, sorted."""
        self.discard = np.empty(discard_bytes, dtype=np.uint8)
        self.register([self.discard.data])

    def register(self, buffers: Sequence[memoryview]) -> None:
        """Let gets land in these buffers (they must outlive the registration)."""
        for buf in buffers:
            start = address(buf)
            if self.client.register_buffer(start, buf.nbytes) != 0:
                raise RuntimeError(f"Mooncake refused to register a {buf.nbytes} B buffer")
            bisect.insort(self.spans, (start, start + buf.nbytes))

    def unregister(self, buffers: Sequence[memoryview]) -> None:
        for buf in buffers:
            start = address(buf)
            self.client.unregister_buffer(start)
            self.spans.remove((start, start + buf.nbytes))

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Whether each range (uint64 address, int64 length) lies in one registered region."""
        starts = np.array([a for a, _ in self.spans], np.uint64)
        ends = np.array([b for _, b in self.spans], np.uint64)
        i = np.searchsorted(starts, addresses, side="right") - 1
        inside = ends[np.maximum(i, 0)] >= addresses + nbytes.astype(np.uint64)
        return (i >= 0) & inside

    def at(self, view: memoryview) -> int | None:
        """The address of `view` if it lies in one registered region, else None."""
        start = address(view)
        i = bisect.bisect_right(self.spans, (start, 1 << 64)) - 1
        return start if i >= 0 and start + view.nbytes <= self.spans[i][1] else None

    def addresses(self, buffers: Sequence[memoryview]) -> list[int] | None:
        """Each buffer's address, or None unless every one lies in one registered region."""
        starts = [self.at(view) for view in buffers]
        return None if None in starts else [a for a in starts if a is not None]

    def scatter(self, size: int, ranges: Sequence[Range]) -> tuple[list[int], list[int]] | None:
        """(addresses, lengths) that cover the whole object in order: each range's buffers,
        the gaps between them into the discard region; None unless every buffer is
        registered."""
        ptrs: list[int] = []
        sizes: list[int] = []
        at, discard, most = 0, self.discard.ctypes.data, self.discard.nbytes
        for offset, buffers in [*ranges, (size, [])]:
            while at < offset:  # bytes no buffer asked for, up to this range (or the end)
                ptrs.append(discard)
                sizes.append(min(offset - at, most))
                at += sizes[-1]
            starts = self.addresses(buffers)
            if starts is None:
                return None
            ptrs += starts
            sizes += [view.nbytes for view in buffers]
            at += sum(view.nbytes for view in buffers)
        return (ptrs, sizes) if at == size else None

    def part_of(
        self, size: int, ranges: Sequence[Range], slack: int = 0
    ) -> tuple[list[int], ...] | None:
        """(addresses, lengths, offsets in the object) of a read of part of an object (a
        streamed load's group of layers) into registered buffers; None for a whole object,
        or all of it but `slack` bytes (one plain get moves it faster, `scatter`), or any
        buffer not registered."""
        ptrs: list[int] = []
        sizes: list[int] = []
        offsets: list[int] = []
        for offset, buffers in ranges:
            starts = self.addresses(buffers)
            if starts is None:
                return None
            ptrs += starts
            lengths = [view.nbytes for view in buffers]
            offsets += [offset + before for before in itertools.accumulate([0, *lengths[:-1]])]
            sizes += lengths
        return None if sum(sizes) + slack >= size else (ptrs, sizes, offsets)

    def close(self) -> None:
        self.unregister([self.discard.data])
