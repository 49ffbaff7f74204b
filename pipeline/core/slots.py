"""Logical token slots and the pages they form: validation, and page allocation.

A transfer names logical slots. With decode context parallelism (DCP) a page holds
page_size x dcp_size logical slots ("slots per page"): slot s lives on DCP rank s % dcp_size at
local row s // dcp_size, so logical page p is local page p on every DCP rank, and a plan needs
only the page ids (`pages_of`), never the rows.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch


def pages_of(name: str, indices: torch.Tensor, slots_per_page: int, num_slots: int) -> torch.Tensor:
    """The page ids of whole, aligned pages of logical slots (CPU int64), which are also the
    local page ids on every DCP rank; every malformed input gets a ValueError naming it."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of slot indices")
    if indices.layout is not torch.strided:
        raise ValueError(
            f"{name} must be a dense tensor of slot indices (got {indices.layout}): "
            "pass .to_dense()"
        )
    if indices.device.type != "cpu" or indices.dtype != torch.int64:
        raise ValueError(
            f"{name} must be a CPU int64 tensor (got {indices.dtype} on "
            f"{indices.device}): plans are computed on the host"
        )
    n = len(indices)
    if n == 0 or n % slots_per_page:
        raise ValueError(
            f"{name} has {n} slots: transfers move whole pages of {slots_per_page} slots "
            "(page_size x dcp_size)"
        )
    # numpy, single-threaded: torch's intra-op thread pool costs more than the work for small
    # ops on a host shared by several ranks, and this runs on every transfer's issue path
    slots = indices.numpy()
    starts = slots[::slots_per_page]
    # the range on the page starts alone, by comparisons (arithmetic on slots near 2**63
    # would wrap around): a start in range whose page then runs +1 each stays in range, since
    # every pool holds whole pages
    if starts.min() < 0 or starts.max() >= num_slots:
        raise ValueError(f"{name} has slots outside 0..{num_slots - 1}")
    # each page's slots are its start +0, +1, ...: the slots compared with what they must be,
    # built from the starts in range (no arithmetic on the untrusted slots themselves)
    whole = (starts[:, None] + np.arange(slots_per_page)).ravel()
    if (starts % slots_per_page).any() or not np.array_equal(slots, whole):
        raise ValueError(
            f"{name} is not page-aligned: every {slots_per_page} consecutive slots must "
            f"be one whole page (start at a multiple of {slots_per_page}, then +1 each)"
        )
    pages = starts // slots_per_page
    ordered = np.sort(pages)
    if (ordered[1:] == ordered[:-1]).any():
        raise ValueError(f"{name} names a page twice: each page moves once per transfer")
    return torch.from_numpy(pages)


def page_rows(
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    slots_per_page: int,
    host_slots: int,
    device_slots: int,
) -> np.ndarray:
    """[host pages, device pages] of a transfer's slots (`pages_of` each, as one int64
    array: a kernel's page ids go to the device in one copy), checked together. The issue
    path pays each distinct numpy call at many times its hot cost once the host has run
    other work for a while (BENCHMARKS.md, issue time), so this makes few of them, and
    returns numpy: everything that reads the pages on the issue path takes numpy. Anything
    it does not accept goes to `pages_of` per side, whose errors name the side."""
    n = _whole_pages(host_indices, slots_per_page)
    if n and n == _whole_pages(device_indices, slots_per_page):
        hosts = host_indices.numpy().reshape(n, slots_per_page)
        devices = device_indices.numpy().reshape(n, slots_per_page)
        pages = np.concatenate((hosts[:, 0], devices[:, 0])) // slots_per_page
        # sorted as unsigned (a copy: the cast wraps), so a negative page sorts last, above
        # every pool's size; in place, as np.sort's wrapper is more calls
        ordered = pages.astype(np.uint64).reshape(2, n)
        ordered.sort(axis=1)
        host_top, device_top = ordered[:, -1].tolist()
        # the pages in range before any arithmetic on them (near 2**63 it would wrap); a
        # page's slots are then exactly its page's first slot +0, +1, ...: alignment and
        # order at once
        if (
            host_top < host_slots // slots_per_page
            and device_top < device_slots // slots_per_page
            and not (ordered[:, 1:] == ordered[:, :-1]).any()
        ):
            whole = pages[:, None] * slots_per_page + np.arange(slots_per_page)
            if not ((hosts != whole[:n]).any() or (devices != whole[n:]).any()):
                return pages.reshape(2, n)
    host = pages_of("host_indices", host_indices, slots_per_page, host_slots)
    device = pages_of("device_indices", device_indices, slots_per_page, device_slots)
    if len(host_indices) != len(device_indices):
        raise ValueError(
            f"host_indices has {len(host_indices)} slots and device_indices "
            f"{len(device_indices)}: pass one device slot per host slot"
        )
    return np.stack((host.numpy(), device.numpy()))


def _whole_pages(indices: torch.Tensor, slots_per_page: int) -> int:
    """Pages of a CPU int64 vector of whole pages of slots; 0 for anything else."""
    if not isinstance(indices, torch.Tensor) or indices.ndim != 1:
        return 0
    if not indices.is_cpu or indices.dtype != torch.int64:  # is_cpu: no device object
        return 0
    if indices.layout is not torch.strided:  # sparse: numpy cannot see it
        return 0
    n = indices.shape[0]  # not len(): torch's __len__ is Python around more calls
    return 0 if n % slots_per_page else n // slots_per_page


def page_tokens(pages: list[int], slots_per_page: int) -> torch.Tensor:
    """Token slots of whole pages, in page order (int64, CPU)."""
    p = torch.tensor(pages, dtype=torch.int64).unsqueeze(1)
    return (p * slots_per_page + torch.arange(slots_per_page, dtype=torch.int64)).reshape(-1)


class PageAllocator:
    """Hands out free pages: the first free ones, or a seeded random sample (fragmented); and
    remembers which pages hold data (a host pool's pages once backed up, until freed), and
    which allocated pages are lent to a prefetch (its reads own them until it ends).

    Deterministic: the same calls give the same pages on every rank.
    """

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = set(range(num_pages))
        self._holds_data = np.zeros(num_pages, dtype=bool)
        self._own = np.zeros(num_pages, dtype=bool)
        """Allocated and the caller's: neither free nor lent."""
        self._lent: dict[int, str] = {}
        """Lent pages: who holds each (a prefetch, named as the refusals name it)."""
        self.freed: Callable[[list[int]], None] | None = None
        """Told the pages each `free` frees (an engine's KV events: a host eviction)."""

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, num_pages: int, rng: random.Random | None = None) -> list[int]:
        if num_pages < 0:
            raise ValueError(f"cannot allocate {num_pages} pages")
        if num_pages > len(self._free):
            raise ValueError(
                f"out of pages: asked for {num_pages}, {len(self._free)} free of {self.num_pages}"
            )
        free = sorted(self._free)
        return self.claim(free[:num_pages] if rng is None else rng.sample(free, num_pages))

    def claim(self, pages: list[int]) -> list[int]:
        """Allocate the named free pages (a caller that places its pages itself); ValueError
        naming those that are not free."""
        if taken := [p for p in pages if p not in self._free]:
            raise ValueError(f"pages {taken[:8]} are not free (or out of range)")
        if len(set(pages)) != len(pages):
            raise ValueError("pages repeat in one claim")
        self._free.difference_update(pages)
        self._own[pages] = True
        return list(pages)

    def free(self, pages: list[int]) -> None:
        taken = [p for p in pages if p in self._free or not 0 <= p < self.num_pages]
        if taken or len(set(pages)) != len(pages):
            raise ValueError(f"pages {taken[:8]} are not allocated (or repeat in one call)")
        if lent := [p for p in pages if p in self._lent]:
            raise ValueError(f"pages {lent[:8]} are lent to {self._lent[lent[0]]}")
        self._free.update(pages)
        self._holds_data[pages] = False
        self._own[pages] = False
        if self.freed is not None:
            self.freed(pages)

    def free_pages(self) -> list[int]:
        return sorted(self._free)

    def lend(self, pages: np.ndarray, holder: str) -> None:
        """Lend allocated pages (the caller's, checked by `require_own`) to `holder`: every
        call naming them is refused, saying `holder`, until `take_back`."""
        self._own[pages] = False
        self._lent.update(dict.fromkeys(pages.tolist(), holder))

    def take_back(self, pages: np.ndarray) -> None:
        """End a lend: the pages are the caller's again (still allocated)."""
        for page in pages.tolist():
            del self._lent[page]
        self._own[pages] = True

    def require_own(self, name: str, pages: np.ndarray) -> None:
        """ValueError naming `name` unless every page is allocated and not lent (to a
        prefetch, whose reads may still write into it)."""
        if not self._own[pages].all():  # the issue path's case, in two numpy calls
            self._refuse(name, pages)

    @property
    def lending(self) -> bool:
        """Some pages are lent now."""
        return bool(self._lent)

    def require_unlent(self, name: str, pages: np.ndarray) -> None:
        """ValueError naming `name` if a page is lent to a prefetch (a backup may still name
        pages it never allocated: the jobs and benches manage host pages of their own)."""
        if self._lent and any(p in self._lent for p in pages.tolist()):
            self._refuse(name, pages)

    def _refuse(self, name: str, pages: np.ndarray) -> None:
        """The ValueError for pages that are lent or not allocated."""
        if lent := [p for p in pages.tolist() if p in self._lent]:
            raise ValueError(
                f"{name} names host pages {lent[:8]} that {self._lent[lent[0]]} holds: its "
                "reads may still write into them; finish it first (Engine.load_prefetched) or "
                "cancel it (Prefetch.cancel)"
            )
        loose = pages[~self._own[pages]].tolist()
        raise ValueError(
            f"{name} names host pages that are not allocated (never allocated by "
            f"Engine.host_slots.alloc, or freed since): {loose[:8]}"
        )

    def hold_data(self, pages: np.ndarray, held: bool = True) -> None:
        """Mark pages as holding data (a backup wrote them), or as not (it failed)."""
        self._holds_data[pages] = held

    def num_with_data(self) -> int:
        """Pages that hold data now."""
        return int(self._holds_data.sum())

    def without_data(self, pages: np.ndarray) -> list[int]:
        """The pages among `pages` that hold no data (never written, or freed since)."""
        return pages[~self._holds_data[pages]].tolist()

    def require_data(self, name: str, pages: np.ndarray) -> None:
        """ValueError naming `name` when some of `pages` hold no data (a load would read
        garbage), saying so where they are lent to a prefetch or not allocated (lent pages
        hold none: a backup refuses them, a prefetch takes none that do)."""
        if self._holds_data[pages].all():  # the issue path's case, in two numpy calls
            return
        self.require_unlent(name, pages)
        empty = np.asarray(self.without_data(pages), dtype=np.int64)
        self.require_own(name, empty)  # no data, and not allocated either: say that
        if len(empty):
            raise ValueError(
                f"{name} name pages that hold no data: {empty[:8].tolist()} (never backed up, "
                "or freed since)"
            )
