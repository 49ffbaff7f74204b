"""Write admission: which pages a write-back stores (`storage.write_admission`).

`always` stores every page. `after_hits` counts, per page key, the lookups and prefetches that
named it, and a write-back stores only the pages named `storage.admit_after_hits` times, so a
one-off prompt's prefix never fills the store (vLLM's `store_threshold`, SGLang's
`write_through_selective`). A load from L3 adds no count: it follows the lookup that found the
pages, and they are stored already. Lookups and prefetches are collectives of the replica group
with the same keys on every rank, so every rank holds the same counts and decides alike (no
message is needed). The counts are bounded: the least recently named page is forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from pipeline.core.storage import StorageConfig, WriteAdmission


class Admission:
    """One rank's count of how often each page key was named, and the pages it admits."""

    def __init__(self, storage: StorageConfig) -> None:
        self.after = (
            storage.admit_after_hits if storage.write_admission is WriteAdmission.after_hits else 0
        )
        """Namings a page needs before a write-back stores it (0: every page is stored)."""
        self.tracked = storage.admit_tracked_pages
        self._named: OrderedDict[str, int] = OrderedDict()

    def named(self, keys: list[str]) -> None:
        """A lookup or prefetch named `keys` (each at most once a call)."""
        if not self.after:
            return
        named = self._named
        for key in dict.fromkeys(keys):
            named[key] = named.pop(key, 0) + 1  # the most recent last
        while len(named) > self.tracked:
            named.popitem(last=False)

    def admitted(self, keys: list[str]) -> np.ndarray:
        """Which of a write-back's `keys` it stores (a bool per key)."""
        if not self.after:
            return np.ones(len(keys), dtype=bool)
        return np.array([self._named.get(key, 0) >= self.after for key in keys], dtype=bool)
