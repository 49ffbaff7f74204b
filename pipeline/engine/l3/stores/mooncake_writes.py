"""A write-back's objects stored in Mooncake in one client call (`UnitsWriter.put_many`).

Each object goes as the Mooncake objects it is kept as (its pieces, `mooncake_pieces`). Those
not in the store yet go in one `batch_put_from_multi_buffers`, each from its parts where they
lie (the pool's pages, registered with the client; the headers copied into a registered
staging buffer, as many calls as the headers fill buffers). The client's put keeps an object
already there as it is, so one the store holds (to be replaced) and one whose pages lie
outside registered memory (a rotating owner's received units) are each one `upsert_parts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.mooncake_calls import BoundedCalls
from pipeline.engine.l3.stores.mooncake_pieces import Pieces
from pipeline.engine.l3.stores.mooncake_regions import address
from pipeline.engine.l3.stores.parts import Part


class PutStore(Protocol):
    """What a `MooncakeWrites` writes through (the Mooncake store)."""

    client: Any
    call: BoundedCalls
    counters: Counters
    staging_bytes: int
    pieces: Pieces

    def upsert(self, name: str, views: Sequence[memoryview]) -> None: ...

    def held(self, names: list[str]) -> list[bool]: ...

    def drop(self, names: list[str]) -> None: ...

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray: ...

    def staging(self) -> np.ndarray: ...

    def unstaged(self, buffer: np.ndarray) -> None: ...


Object = tuple[str, Sequence[Part]]
Kept = tuple[str, list[memoryview], np.ndarray]
"""A Mooncake object to put (a piece, or a whole blob): its name, its buffers, and which of
them lie outside registered memory (they are staged)."""


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
        if not objects:
            return
        kept, owners = self._kept(objects)
        names = [name for name, _, _ in kept]
        firsts = np.searchsorted(owners, np.arange(len(objects) + 1)).tolist()  # owners sorted
        stale = [
            form
            for o, (name, _) in enumerate(objects)
            for form in self.store.pieces.stale(name, names[firsts[o] : firsts[o + 1]])
        ]
        there = self.store.held(names + stale)
        failures = self._write(kept, there[: len(kept)])
        try:  # the forms of an object that its new form replaces
            self.store.drop(
                [form for form, found in zip(stale, there[len(kept) :], strict=True) if found]
            )
        except Exception as e:
            failures.append(("", e))
        failed = {name for name, _ in failures}
        bad = {o for o, name in zip(owners, names, strict=True) if name in failed}
        done = [vs for o, (_, vs, _) in zip(owners, kept, strict=True) if o not in bad]
        self.store.counters.add(
            writes=len(objects) - len(bad), written_bytes=sum(v.nbytes for vs in done for v in vs)
        )
        if failures:
            raise failures[0][1]

    def _write(self, kept: list[Kept], there: list[bool]) -> list[tuple[str, Exception]]:
        """Each of `kept` (`there`: it is in the store already): the new ones whose staged
        parts fit a staging buffer in one call a buffer, the others one upsert each. Each
        failure."""
        fits = [
            not found and staged(k) <= self.store.staging_bytes
            for k, found in zip(kept, there, strict=True)
        ]
        batched = [k for k, fit in zip(kept, fits, strict=True) if fit]
        failures: list[tuple[str, Exception]] = []
        at = 0
        while at < len(batched):  # as many objects as a staging buffer holds the staged parts of
            sums = np.cumsum([staged(k) for k in batched[at:]])
            count = max(1, int(np.searchsorted(sums, self.store.staging_bytes, side="right")))
            failures += self._put(batched[at : at + count])
            at += count
        for k in [k for k, fit in zip(kept, fits, strict=True) if not fit]:
            try:
                self.store.upsert(k[0], k[1])
            except Exception as e:  # the first is raised once every object was tried
                failures.append((k[0], e))
        return failures

    def _kept(self, objects: Sequence[Object]) -> tuple[list[Kept], list[int]]:
        """The Mooncake objects `objects` are kept as, and which of `objects` each is."""
        named = [
            (o, p)
            for o, (name, parts) in enumerate(objects)
            for p in self.store.pieces.parts(name, parts)
        ]
        views = [v for _, (_, vs) in named for v in vs]
        addresses = np.array([address(v) for v in views], np.uint64)
        nbytes = np.array([v.nbytes for v in views], np.int64)
        away = ~self.store.registered(addresses, nbytes)
        cuts = np.cumsum([len(vs) for _, (_, vs) in named])[:-1]
        kept = [
            (name, vs, out)
            for (_, (name, vs)), out in zip(named, np.split(away, cuts), strict=True)
        ]
        return kept, [o for o, _ in named]

    def _put(self, objects: Sequence[Kept]) -> list[tuple[str, Exception]]:
        """The objects in one client call, their parts outside registered memory staged:
        each failure."""
        buffer = self.store.staging()
        names = [name for name, _, _ in objects]
        try:
            ptrs: list[list[int]] = []
            at = 0
            for _, views, away in objects:
                ptrs.append([])
                for view, out in zip(views, away, strict=True):
                    if out:
                        buffer[at : at + view.nbytes] = np.frombuffer(view, np.uint8)
                    ptrs[-1].append(buffer.ctypes.data + at if out else address(view))
                    at += view.nbytes if out else 0
            sizes = [[v.nbytes for v in views] for _, views, _ in objects]
            try:
                codes = self.store.call(
                    self.store.client.batch_put_from_multi_buffers, names, ptrs, sizes
                )
            except Exception as e:  # an unreachable master: every object failed
                return [(name, e) for name in names]
        finally:
            self.store.unstaged(buffer)
        return [
            (name, RuntimeError(f"Mooncake put of {name} returned {code}"))
            for name, code in zip(names, codes, strict=True)
            if code != 0
        ]


def staged(kept: Kept) -> int:
    """Bytes of a Mooncake object's buffers that go through a staging buffer."""
    _, views, away = kept
    return sum(v.nbytes for v, out in zip(views, away, strict=True) if out)
