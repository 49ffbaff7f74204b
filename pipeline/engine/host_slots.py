"""The host tier's slots as a serving engine manages them, in token slots like every other
index: allocate free slots, free them after an eviction, or keep them allocated and drop their
data so that `Engine.load_from_l3` may read into them.

The free list is replicated state (`Engine.state_digest` covers it): make the same calls in the
same order on every rank and every rank gets the same slots.

Slots have one owner. Allocated slots are the caller's; slots handed to `Engine.prefetch` are
the prefetch's until `Engine.load_prefetched` or `Prefetch.cancel` ends it (its reads may
write into them until then), and every call naming them (`free`, `reuse`, `backup`, `load`,
`write_back`, `load_from_l3`, `prefetch`) is refused with a ValueError naming the prefetch.
Slots never allocated (or freed) are refused by every call but `backup`.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.core.slots import PageAllocator, page_tokens, pages_of


class HostSlots:
    """An engine's host slots (whole pages of `slots_per_page` token slots), handed out and
    taken back; a view over the engine's page allocator."""

    def __init__(self, pages: PageAllocator, slots_per_page: int) -> None:
        self._pages = pages
        self._per_page = slots_per_page

    @property
    def num_slots(self) -> int:
        """Host slots in all (free or not)."""
        return self._pages.num_pages * self._per_page

    @property
    def num_free(self) -> int:
        """Host slots free to allocate."""
        return self._pages.num_free * self._per_page

    def alloc(self, num_slots: int) -> torch.Tensor:
        """`num_slots` free host slots (CPU int64, whole pages, the lowest free pages first),
        which hold no data yet: a backup or a `load_from_l3` may fill them."""
        if isinstance(num_slots, bool) or not isinstance(num_slots, int):
            raise ValueError(f"num_slots must be an int (got {type(num_slots).__name__})")
        if num_slots <= 0 or num_slots % self._per_page:
            raise ValueError(
                f"num_slots={num_slots} must be a positive multiple of {self._per_page} "
                "(whole pages of page_size x dcp_size slots)"
            )
        if num_slots > self.num_free:
            raise ValueError(
                f"num_slots={num_slots}: only {self.num_free} of {self.num_slots} host slots "
                "are free; free some first (Engine.host_slots.free)"
            )
        pages = self._pages.alloc(num_slots // self._per_page)
        self._pages.hold_data(np.asarray(pages, dtype=np.int64), held=False)
        return page_tokens(pages, self._per_page)

    def free(self, host_slots: torch.Tensor) -> None:
        """Give allocated host slots back once nothing in flight uses them (after an eviction:
        their data is gone, and a later `alloc` may hand them out again). Refused (ValueError
        naming `host_slots`) for slots not allocated, or lent to a prefetch not yet loaded
        or cancelled. Not a collective, but replicated state: call it on every rank alike."""
        self._pages.free(self._allocated(host_slots).tolist())

    def reuse(self, host_slots: torch.Tensor) -> None:
        """Keep allocated host slots but drop the data they hold, so that `load_from_l3` may
        read other pages into them (it refuses slots that hold data, which it would lose).
        Refused like `free`."""
        self._pages.hold_data(self._allocated(host_slots), held=False)

    def _allocated(self, host_slots: torch.Tensor) -> np.ndarray:
        """The pages of `host_slots`; ValueError naming it for a malformed slot list, a slot
        out of range, a page that is not allocated (never, or freed already: a double free)
        or one lent to a prefetch."""
        pages = pages_of("host_slots", host_slots, self._per_page, self.num_slots).numpy()
        self._pages.require_own("host_slots", pages)
        return pages
