"""Which of vLLM's blocks the host tier holds, decided in vLLM's scheduler process: a host
page per block hash, the least recently used evicted first, a page pinned while a step's
load or backup uses it (one owner at a time). Workers carry the decisions out in order."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from vllm.v1.core.kv_cache_utils import BlockHash  # vLLM's: bytes


@dataclass(frozen=True)
class Placed:
    """Pages given to blocks, and the pages (with the blocks they held) evicted for them:
    freed by the workers before anything else."""

    pages: list[int]
    evicted: list[int]
    evicted_hashes: list[BlockHash]


class HostDirectory:
    """`num_pages` host pages: block hash -> page, in least-recently-used order."""

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._pages: OrderedDict[BlockHash, int] = OrderedDict()
        self._free = list(range(num_pages - 1, -1, -1))  # popped from the end: page 0 first
        self._pinned: set[int] = set()

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._pages

    def leading(self, hashes: Sequence[BlockHash]) -> int:
        """How many of `hashes`, from the first, the host tier holds."""
        for count, block_hash in enumerate(hashes):
            if block_hash not in self._pages:
                return count
        return len(hashes)

    def pages_of(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The pages holding `hashes` (each held), pinned and made most recent."""
        pages = [self._pages[h] for h in hashes]
        for h in hashes:
            self._pages.move_to_end(h)
        self._pinned.update(pages)
        return pages

    def room(self) -> int:
        """Blocks `place` can take now: free pages and unpinned ones."""
        return len(self._free) + sum(p not in self._pinned for p in self._pages.values())

    def place(self, hashes: Sequence[BlockHash]) -> Placed | None:
        """A page for each of `hashes` (none held), pinned, evicting the least recent
        unpinned pages to make room; None where too few pages are free or unpinned."""
        evictable = [(h, p) for h, p in self._pages.items() if p not in self._pinned]
        short = len(hashes) - len(self._free)
        if short > len(evictable):
            return None
        evicted = evictable[: max(short, 0)]
        for h, page in evicted:
            del self._pages[h]
            self._free.append(page)
        pages = [self._free.pop() for _ in hashes]
        self._pages.update(zip(hashes, pages, strict=True))
        self._pinned.update(pages)
        return Placed(pages, [p for _, p in evicted], [h for h, _ in evicted])

    def drop(self, hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """Forget `hashes` (a load found them missing or corrupt; the workers freed their
        pages): those it held."""
        held = [h for h in hashes if h in self._pages]
        pages = [self._pages.pop(h) for h in held]
        self._pinned.difference_update(pages)
        self._free.extend(pages)
        return held

    def unpin(self, pages: Sequence[int]) -> None:
        self._pinned.difference_update(pages)
