"""Reads of parts of a file store's objects, each held open from its first read to the last."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Protocol

import crc32c

from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.direct import DirectReads
from pipeline.engine.l3.stores.parts import Check, PartRead, Range, SpanReads


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


class FileParts:
    """Reads of parts of a file store's objects, several each (a streamed load's later groups
    of layers, one run of pages): each object is opened at its first read and held until
    `close`, so a later read is one `preadv` and its check (an object replaced meanwhile is
    read as it was when opened). Where this process may open no more files, it lets go of
    what it holds and the read opens its object for itself."""

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

    def _read(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        held = self.held.get(name)
        if held is None:
            try:
                held = self.held[name] = self.store.open_read(name)
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors
                    self.close()
                    return self.store.read_once(name, size, ranges, check)
                return False
            except ValueError:
                return False
        return self.store.read_open(*held, size, ranges, check)

    def close(self) -> None:
        for fd, _ in self.held.values():
            os.close(fd)
        self.held.clear()
