"""The I/O threads' scratch buffers: an object's header, and its payload where a page is staged
(a pool that holds a unit's page apart, or token-major)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from pipeline.core.l3 import PageObject
from pipeline.core.model import Unit
from pipeline.engine.cuda.stacks import stack_views
from pipeline.engine.l3.pages import PageMap, Runs


class Scratch:
    """One I/O thread's buffers: an object's header, and its payload where it is staged."""

    def __init__(self, obj: PageObject, header_bytes: int) -> None:
        self.head = bytearray(header_bytes)
        self.staging = np.empty(obj.page_bytes, dtype=np.uint8)
        self.tensor = torch.from_numpy(self.staging)
        self.bytes = self.staging.data.cast("B")
        self._views: dict[tuple[int, ...], list[torch.Tensor]] = {}
        self._bytes: dict[tuple[int, ...], list[memoryview]] = {}
        self.obj = obj

    def views(self, units: tuple[Unit, ...]) -> list[memoryview]:
        """Each unit's bytes in the staging buffer (at its payload offset)."""
        key = tuple(u.ordinal for u in units)
        if key not in self._bytes:
            offsets = self.obj.offsets
            self._bytes[key] = [
                self.bytes[offsets[u.ordinal] : offsets[u.ordinal] + u.page_bytes] for u in units
            ]
        return self._bytes[key]

    def spans(self, pages: PageMap) -> list[memoryview]:
        """Each of `pages`' groups in the staging buffer as one buffer (at its payload offset;
        a group's units are adjacent there by definition)."""
        return [
            self.bytes[at : at + n] for (at, _), n in zip(pages.groups, pages.totals, strict=True)
        ]

    def like(self, runs: Runs) -> list[torch.Tensor]:
        """The staging buffer viewed as each of `runs`' tensors (made once per set of runs)."""
        key = tuple(u.ordinal for _, units in runs for u in units)
        if key not in self._views:
            found = []
            for tensor, units in runs:
                shape = tensor.shape[-2:]
                per_unit = [
                    self.tensor[self.obj.offsets[u.ordinal] :][: u.page_bytes]
                    .view(tensor.dtype)
                    .view(shape)
                    for u in units
                ]
                stacked = stack_views(per_unit) if len(units) > 1 else per_unit[0]
                assert stacked is not None, "a run's units are evenly spaced in the payload"
                found.append(stacked)
            self._views[key] = found
        return self._views[key]


class Scratches:
    """The I/O threads' scratch buffers, one taken per object in flight."""

    def __init__(self, obj: PageObject, header_bytes: int, count: int) -> None:
        self._free: queue.SimpleQueue[Scratch] = queue.SimpleQueue()
        self.all = [Scratch(obj, header_bytes) for _ in range(count)]
        for scratch in self.all:
            self._free.put(scratch)

    @contextmanager
    def taken(self) -> Iterator[Scratch]:
        scratch = self._free.get()
        try:
            yield scratch
        finally:
            self._free.put(scratch)
