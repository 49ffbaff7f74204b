"""Reads of parts of Mooncake objects through one get session."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.mooncake_calls import BoundedCalls
from pipeline.engine.l3.stores.mooncake_pieces import Pieces
from pipeline.engine.l3.stores.parts import Check, PartRead, Range, SpanReads


class RangedGets(Protocol):
    """What a `MooncakeParts` reads through (the Mooncake store)."""

    client: Any
    call: BoundedCalls
    """Runs a client call bounded by runtime.timeout_s."""
    counters: Counters

    def part_of(self, size: int, ranges: Sequence[Range]) -> tuple[list[int], ...] | None:
        """(addresses, lengths, offsets) of a ranged read into registered memory, or None."""

    pieces: Pieces

    def read_object(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None
    ) -> bool:
        """A read of one Mooncake object (a piece, or a whole blob) without a session (not
        counted)."""

    def read_parts(self, reads: Sequence[PartRead]) -> int:
        """The reads without a session."""


class MooncakeParts:
    """Reads of parts of Mooncake objects through one get session: each object's replica is
    looked up once, at its first read (`batch_get_session_start`), and every later ranged get
    of it asks the master nothing (`batch_get_into_multi_buffer_ranges`); `close` ends the
    session. A session is per key: where one cannot start or its get fails (another reader
    of the same object ended it), that read is made without it (`MooncakeStore.read_parts`).
    Reads of whole pieces (`mooncake_pieces`) need no session: one plain get each."""

    def __init__(self, store: RangedGets) -> None:
        self.store = store
        self.client, self.call = store.client, store.call
        self.open: set[str] = set()

    def read_parts(self, reads: Sequence[PartRead]) -> int:
        kept, owners = self.store.pieces.expand(reads)
        parts = [self.store.part_of(size, ranges) for _, size, ranges, _ in kept]
        if not reads or any(part is None for part in parts):
            return self.store.read_parts(reads)
        names = [name for name, _, _, _ in kept]
        got = self._get(names, [p for p in parts if p is not None])
        done = len(kept)
        for k, (read, count, part) in enumerate(zip(kept, got, parts, strict=True)):
            assert part is not None
            if count == sum(part[1]):
                ok = all(read[3](j) for j in range(len(read[2])))
            else:  # not through the session: read (and checked) without it
                ok = self.store.read_object(*read)
            if not ok:
                done = k
                break
        found = owners[done]
        self.store.counters.add(hits=found, misses=int(found < len(reads)))
        return found

    def read_spans(self, spans: SpanReads) -> int:
        return self.read_parts(spans.part_reads())

    def _get(self, names: list[str], parts: Sequence[tuple[list[int], ...]]) -> list[int]:
        """Each read's bytes landed through the session (negative: not through it)."""
        fresh = [name for name in names if name not in self.open]
        try:
            if fresh:
                started = self.call(self.client.batch_get_session_start, fresh)
                self.open.update(n for n, code in zip(fresh, started, strict=True) if code == 0)
            return list(
                self.call(
                    self.client.batch_get_into_multi_buffer_ranges,
                    *(names, [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts]),
                )
            )
        except Exception:  # an unreachable master or peer: each read tried without it
            return [-1] * len(names)

    def close(self) -> None:
        if self.open:
            with contextlib.suppress(Exception):
                self.call(self.client.batch_get_session_end, sorted(self.open))
            self.open.clear()
