"""Reads that bypass the page cache (O_DIRECT), for a file store whose objects are not cached."""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.engine.l3.stores.parts import Check, Range, copy_out

ALIGN = 4096
"""O_DIRECT reads: buffer address and length in whole blocks of this size (pages)."""


class DirectReads:
    """Buffers for reads that bypass the page cache (O_DIRECT): page-aligned, one per read in
    flight, each holding a whole object rounded up to `ALIGN`."""

    def __init__(self, object_bytes: int, count: int) -> None:
        self.nbytes = -(-object_bytes // ALIGN) * ALIGN
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        for _ in range(count):  # an anonymous mapping starts on a page
            self._free.put(np.frombuffer(mmap.mmap(-1, self.nbytes), dtype=np.uint8))

    def read(self, fd: int, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        """The whole object in one aligned read, then each range copied out and checked."""
        staging = self._free.get()
        try:
            if size > self.nbytes:
                return False
            whole = -(-size // ALIGN) * ALIGN
            if os.preadv(fd, [staging.data[:whole]], 0) != size:  # a short read ends at EOF
                return False
            return copy_out(staging, ranges, check)
        finally:
            self._free.put(staging)


def in_memory(path: Path) -> bool:
    """Whether `path` lies on a file system that lives in memory (tmpfs, ramfs)."""
    best, kind = "", ""
    with contextlib.suppress(OSError), open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, kind = point, fields[2]
    return kind in ("tmpfs", "ramfs")
