"""What a store counts while it runs: plain numbers a caller reads with `stats()`."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

COUNTED = ("hits", "misses", "writes", "written_bytes", "evictions", "evicted_bytes")
"""hits / misses: reads that returned an object, or a miss; writes, written_bytes: objects
put; evictions, evicted_bytes: objects this process removed to stay under capacity."""


class Counters:
    """Counts that the store's I/O threads add to at once (a lock keeps every increment)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self.listeners: list[Callable[[list[str]], None]] = []
        """Told the names of the objects this process evicts (an engine's KV events)."""

    def evicted(self, names: list[str], nbytes: int) -> None:
        """Objects this process removed to stay under capacity (`nbytes` in all): counted,
        and told to each listener (on the thread that evicted)."""
        self.add(evictions=len(names), evicted_bytes=nbytes)
        for listener in list(self.listeners):
            listener(names)

    def add(self, **amounts: int) -> None:
        with self._lock:
            self._counts.update(amounts)

    def snapshot(self) -> dict[str, int]:
        """Every counted name (`COUNTED`), 0 where nothing happened yet."""
        with self._lock:
            return {name: self._counts[name] for name in COUNTED}
