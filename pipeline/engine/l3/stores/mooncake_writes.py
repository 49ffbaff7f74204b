"""A write-back's objects stored in Mooncake in one client call (`UnitsWriter.put_many`).

Objects not in the store yet go in one `batch_put_from_multi_buffers`, each from its parts where
they lie (the pool's pages, registered with the client; the headers copied into a registered
staging buffer, as many calls as the headers fill buffers). The client's put keeps an object
already there as it is, so an object the store holds (to be replaced) and one whose pages lie
outside registered memory (a rotating owner's received units) are each one `upsert_parts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.mooncake_calls import BoundedCalls
from pipeline.engine.l3.stores.parts import Part, bytes_views


class PutStore(Protocol):
    """What a `MooncakeWrites` writes through (the Mooncake store)."""

    client: Any
    call: BoundedCalls
    counters: Counters
    staging_bytes: int

    def put(self, name: str, parts: Sequence[Part]) -> None: ...

    def exists(self, names: list[str]) -> list[bool]: ...

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray: ...

    def staging(self) -> np.ndarray: ...

    def unstaged(self, buffer: np.ndarray) -> None: ...


Object = tuple[str, Sequence[Part]]


class MooncakeWrites:
    """Writes many objects at once (see the module)."""

    def __init__(self, store: PutStore) -> None:
        self.store = store

    sums_units = False  # the client reads the parts itself: they are summed before

    def put_many(
        self,
        objects: Sequence[Object],
        tables: Sequence[int] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        if tables is not None or units is not None:
            raise ValueError("Mooncake writes sum no units: pass headers already summed")
        there = self.store.exists([name for name, _ in objects]) if objects else []
        batched: list[Object] = []
        alone: list[Object] = []
        for (name, parts), found in zip(objects, there, strict=True):
            lent = not found and len(parts) > 1 and self._registered(parts[1:])
            (batched if lent else alone).append((name, parts))
        failures: list[Exception] = []
        at = 0
        while at < len(batched):  # as many objects as one staging buffer holds the headers of
            heads = np.cumsum([memoryview(parts[0]).nbytes for _, parts in batched[at:]])
            count = max(1, int(np.searchsorted(heads, self.store.staging_bytes, side="right")))
            failures += self._put(batched[at : at + count])
            at += count
        for name, parts in alone:
            try:
                self.store.put(name, parts)
            except Exception as e:  # the first is raised once every object was tried
                failures.append(e)
        if failures:
            raise failures[0]

    def _registered(self, parts: Sequence[Part]) -> bool:
        views = bytes_views(parts)
        addresses = np.array([np.frombuffer(v, np.uint8).ctypes.data for v in views], np.uint64)
        nbytes = np.array([v.nbytes for v in views], np.int64)
        return bool(self.store.registered(addresses, nbytes).all())

    def _put(self, objects: Sequence[Object]) -> list[Exception]:
        """The objects in one client call, their headers staged: each failure."""
        buffer = self.store.staging()
        try:
            ptrs, sizes, at = [], [], 0
            for _, parts in objects:
                head, units = memoryview(parts[0]).cast("B"), bytes_views(parts[1:])
                if at + head.nbytes > buffer.nbytes:
                    return [RuntimeError("a Mooncake put's header outgrows its staging buffer")]
                buffer[at : at + head.nbytes] = np.frombuffer(head, np.uint8)
                addresses = [np.frombuffer(v, np.uint8).ctypes.data for v in units]
                ptrs.append([buffer.ctypes.data + at, *addresses])
                sizes.append([head.nbytes, *(v.nbytes for v in units)])
                at += head.nbytes
            names = [name for name, _ in objects]
            try:
                codes = self.store.call(
                    self.store.client.batch_put_from_multi_buffers, names, ptrs, sizes
                )
            except Exception as e:  # an unreachable master: every object failed
                return [e]
        finally:
            self.store.unstaged(buffer)
        failed = [
            RuntimeError(f"Mooncake put of {name} returned {code}")
            for name, code in zip(names, codes, strict=True)
            if code != 0
        ]
        done = [n for n, code in zip(sizes, codes, strict=True) if code == 0]
        self.store.counters.add(writes=len(done), written_bytes=sum(sum(n) for n in done))
        return list(failed)
