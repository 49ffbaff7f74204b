"""Reads of parts of a file store's objects, each held open from its first read to the last;
a load's ranges in one native call (`_fileio.read_objects`)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Sequence
from typing import Protocol

import crc32c
import numpy as np

from pipeline.engine.l3.stores._fileio import read_objects
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.direct import DirectReads
from pipeline.engine.l3.stores.parts import Check, PartRead, Range, SpanReads, UnitReads


class OpenFiles(Protocol):
    """What a `FileParts` reads through (the file store)."""

    counters: Counters
    direct: DirectReads | None
    """Set where reads bypass the page cache (they go through `read_open`)."""

    def open_read(self, name: str) -> tuple[int, os.stat_result]:
        """A descriptor of the regular file `name` opened for reads, and its status."""

    def read_open(
        self, fd: int, info: os.stat_result, size: int, ranges: Sequence[Range], check: Check | None
    ) -> bool:
        """A read from an object already open."""

    def read_once(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        """A read that opens the object for itself (not counted)."""

    def paths_below(self, names: Sequence[str]) -> tuple[int, list[str]] | None:
        """(the store folder's descriptor, each object's path below it) for native opens
        beneath it, or None where this kernel cannot open beneath a folder in one call."""


class FileParts:
    """Reads of parts of a file store's objects, several each (a streamed load's later groups
    of layers, one run of pages): each object is opened at its first read and held until
    `close`, so a later read is one `preadv` and its check (an object replaced meanwhile is
    read as it was when opened). Where this process may open no more files, it lets go of
    what it holds and the read opens its object for itself."""

    rows = True
    groups = True  # a group's ranges are preads like any other

    def __init__(self, store: OpenFiles) -> None:
        self.store = store
        self.held: dict[str, tuple[int, os.stat_result]] = {}

    def read_parts(self, reads: Sequence[PartRead]) -> int:
        found = next((i for i, read in enumerate(reads) if not self._read(*read)), len(reads))
        self.store.counters.add(hits=found, misses=int(found < len(reads)))
        return found

    def read_spans(self, spans: SpanReads) -> int:
        """The reads of `spans` in order, each a `preadv` and a CRC call (outside Python's
        lock) on the object held open, until one misses."""
        found, plain = 0, self.store.direct is None
        for name, size, offset, view, crc in zip(
            spans.names, spans.sizes, spans.offsets, spans.views, spans.crcs, strict=True
        ):
            held = self.held.get(name)
            if plain and held is not None and held[1].st_size == size:  # the common case
                try:
                    whole = os.preadv(held[0], [view], offset) == view.nbytes
                except OSError:
                    whole = False
                if not whole and not self.store.read_open(*held, size, [(offset, [view])], None):
                    break
            elif not self._read(name, size, [(offset, [view])], None):
                break
            if crc32c.crc32c(view) != crc:
                break
            found += 1
        self.store.counters.add(hits=found, misses=int(found < len(spans.names)))
        return found

    def read_units(self, reads: UnitReads) -> int:
        """Every range in one `read_objects` call on `reads.threads` threads, which open each
        object below the store's folder (or, where this kernel cannot open beneath a folder in
        one call, take the descriptors opened here and held) and take each range's CRC-32C as
        it lands."""
        below = self.store.paths_below(reads.names)
        files = self._opened(reads) if below is None else below
        columns = (reads.offsets, reads.addresses, reads.nbytes, reads.crcs, reads.ends)
        sizes = np.asarray(reads.sizes, np.int64)
        opened, done = read_objects(
            files,
            sizes,
            reads.starts,
            reads.objects,
            *columns,
            reads.threads,
            reads.on_group,
            reads.rows,
            reads.pitches,
        )
        self.store.counters.add(hits=opened, misses=int(opened < len(reads.names)))
        return done

    def _opened(self, reads: UnitReads) -> np.ndarray:
        """Each object's descriptor (held), -1 from the first not there at its size."""
        fds = np.full(len(reads.names), -1, dtype=np.int32)
        for i, (name, size) in enumerate(zip(reads.names, reads.sizes, strict=True)):
            try:
                held = self._held(name)
            except OSError:  # out of descriptors: the objects opened so far are read
                break
            if held is None or held[1].st_size != size:
                break
            if reads.starts:
                used(held[0], held[1].st_mtime_ns)
            fds[i] = held[0]
        return fds

    def _read(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        try:
            held = self._held(name)
        except OSError:  # out of descriptors: what this holds is let go, the read opens its own
            self.close()
            return self.store.read_once(name, size, ranges, check)
        return held is not None and self.store.read_open(*held, size, ranges, check)

    def _held(self, name: str) -> tuple[int, os.stat_result] | None:
        """The object open (opened at its first read), or None where it cannot be (absent,
        not a regular file); OSError where this process may open no more files."""
        held = self.held.get(name)
        if held is None:
            try:
                held = self.held[name] = self.store.open_read(name)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    raise
                return None
            except ValueError:
                return None
        return held

    def close(self) -> None:
        for fd, _ in self.held.values():
            os.close(fd)
        self.held.clear()


def used(fd: int, mtime_ns: int) -> None:
    """Mark the object open at `fd` used now: its access time, which eviction orders by (its
    modification time kept). A store another user owns is read without it."""
    with contextlib.suppress(OSError):
        os.utime(fd, ns=(time.time_ns(), mtime_ns))
