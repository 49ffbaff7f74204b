"""One SGLang host page as one object of this project's format (`pipeline.core.l3`): a header
with a digest per unit (CRC-32C, or a keyed MAC), then the units in order, written from and
read into the host pool as `HostPages` lays them out. A batch of pages moves in one store
call where the engine's loads and write-backs would (`read_many`, `write_many`), else a page
at a time (`read`, `write`)."""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from pipeline.core.l3 import Checks, PageObject, header, unit_digests
from pipeline.engine.l3.intact import read_intact
from pipeline.engine.l3.page_reads import PageReads
from pipeline.engine.l3.pages import PageMap, Placement
from pipeline.engine.l3.stores import ObjectStore, reads_units
from pipeline.engine.l3.writes import page_parts, put_summed
from pipeline.integrations.sglang.host_pages import HostPages


class Scratch:
    """One I/O thread's buffers: an object laid out whole, its header then its payload (what a
    staged layout's page moves through, and what a write-back reads an object there into to
    check it)."""

    def __init__(self, head_bytes: int, pages: HostPages) -> None:
        sizes = [u.nbytes for u in pages.units]
        self.bytes = np.empty(head_bytes + sum(sizes), dtype=np.uint8)
        memory = self.bytes.data.cast("B")
        self.head = memory[:head_bytes]
        self.payload = torch.from_numpy(self.bytes[head_bytes:]).view(pages.buffer.dtype)
        ends = np.cumsum([head_bytes, *sizes]).tolist()
        self.units = [memory[a:b] for a, b in itertools.pairwise(ends)]
        """Each unit's bytes in the payload, in object order."""


class PageIO:
    """Reads and writes pages of one host pool as objects of one namespace (`space`) in a
    store, from `num_threads` threads at once; counts what it found corrupt or forged."""

    def __init__(
        self,
        store: ObjectStore,
        pages: HostPages,
        *,
        space: str,
        share: str,
        checks: Checks,
        num_threads: int,
    ) -> None:
        self.store, self.pages, self.space, self.checks = store, pages, space, checks
        self.object = PageObject(share, pages.model.units)
        self.digest = checks.unit()
        head_bytes = self.object.header_size(space, self.name("0" * 32), checks)
        self.size = head_bytes + self.object.page_bytes
        """Bytes of every object: a read of any other size is a miss."""
        self._all = [Scratch(head_bytes, pages) for _ in range(num_threads)]
        self._free: queue.SimpleQueue[Scratch] = queue.SimpleQueue()
        for scratch in self._all:
            self._free.put(scratch)
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self.map = PageMap(
            self.object, self.object.units, Placement(self.object, pages.unit_views())
        )
        """Where each unit's pages lie in the pool, as the engine's batches read them."""
        reading = reads_units(store)
        self.reads_many = (
            checks.key is None
            and reading.units
            and (self.map.direct or (reading.rows and self.map.native))
        )
        """A batch of pages is one `UnitsReader.read_units` call (CRC-32C checks, a store that
        reads units natively, pages it lands in place), as the engine's loads batch."""
        self.writes_many = checks.key is None and pages.direct and store.units_writer() is not None
        """A batch of pages is one `UnitsWriter.put_many` call, as the engine's write-backs."""
        store.register(self.memory())

    def memory(self) -> list[memoryview]:
        """What reads land in: the pool where pages move in place, and the scratch buffers
        (Mooncake reads straight into registered memory only)."""
        pool = [self.pages.memory] if self.pages.direct else []
        return pool + [s.bytes.data.cast("B") for s in self._all]

    def name(self, key: str) -> str:
        return self.object.name(self.space, key)

    @contextmanager
    def _scratch(self) -> Iterator[Scratch]:
        scratch = self._free.get()
        try:
            yield scratch
        finally:
            self._free.put(scratch)

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def intact(self, name: str) -> bool:
        """Whether `name` holds an intact object of this pool's pages (read whole into a
        scratch buffer and checked as `read` checks it): what a write-back leaves alone."""
        with self._scratch() as scratch:
            whole = (scratch.head, scratch.units)
            return read_intact(
                self.store, self.object, self.space, self.checks, name, whole, self._digests
            )

    def _digests(self, units: list[memoryview]) -> list[int]:
        return [self.digest(u) for u in units]

    def write(self, key: str, page: int) -> None:
        """Store host page `page` as the object of `key` (the store raises where it fails)."""
        name = self.name(key)
        with self._scratch() as scratch:
            if self.pages.direct:
                units = self.pages.views(page)
            else:
                stacked = self.pages.stacked(page)
                scratch.payload.view(stacked.shape).copy_(stacked)
                units = scratch.units
            digests = self._digests(units)
            head = header(self.space, name, digests, [u.nbytes for u in units], self.checks)
            self.store.put(name, [head, *units])

    def read(self, key: str, page: int) -> bool:
        """Fill host page `page` from the object of `key`; False for a miss (absent, another
        size, a header or a unit that fails its digest, or not this key's MAC). A direct
        page that missed may hold some of the object's bytes: SGLang does not use a page
        whose read failed; a staged page is written only once every unit checked out."""
        name = self.name(key)
        failed: list[str] = []
        with self._scratch() as scratch:
            units = self.pages.views(page) if self.pages.direct else scratch.units

            def check(_: int) -> bool:
                table = unit_digests(scratch.head, self.object, self.space, name, self.checks)
                if table is None:
                    failed.append("forged" if self.checks.key is not None else "corrupt")
                    return False
                if any(self.digest(u) != d for u, d in zip(units, table, strict=True)):
                    failed.append("corrupt")
                    return False
                return True

            found = self.store.read(name, self.size, [(0, [scratch.head, *units])], check)
            if found and not self.pages.direct:
                stacked = self.pages.stacked(page)
                stacked.copy_(scratch.payload.view(stacked.shape))
        if not found and not failed and self.checks.key is not None:
            # another size: an object written without this key (its digests are narrower)
            failed += ["forged"] if self.store.exists([name]) == [True] else []
        for what in failed:
            self._count(f"{what}_objects")
        return found

    def read_many(self, keys: list[str], pages: list[int], threads: int) -> int:
        """Fill host pages `pages` from the objects of `keys` in one store call on `threads`
        threads (`reads_many` only); how many pages, from the first, were read intact (the
        reads stop at a missing object, and SGLang takes the pages up to the first miss)."""
        reader = self.store.units_reader()
        assert reader is not None, "reads_many asked the store"
        try:
            tables: list[list[int]] = [[] for _ in keys]
            into, corrupt = np.asarray(pages, np.int64), lambda: self._count("corrupt_objects")
            plan = PageReads(self, self.map, keys, into, tables, threads, corrupt)
            return plan.intact(0, reader.read_units(plan.reads([0, len(keys)], None)) // plan.per)
        finally:
            reader.close()

    def write_many(self, keys: list[str], pages: list[int], threads: int) -> None:
        """Store host pages `pages` as the objects of `keys` in one store call, each unit
        summed as it is written where the store can (`writes_many` only); the first failure
        is raised once every page was tried."""
        writer = self.store.units_writer()
        assert writer is not None, "writes_many asked the store"
        units = page_parts(self.map, pages, cut=writer.sums_units)
        put_summed(writer, self, [self.name(key) for key in keys], units, threads)

    def close(self) -> None:
        self.store.unregister(self.memory())
