"""How the KV events name a page: by the serving engine's own block hash, as its own events
do, where the page's key remembers one (`page_keys` makes such keys), in the form the
consumer's decoder reads (`events.media`); else by the page key's first 64 bits."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.core.events import EventsMedia
from pipeline.core.l3_keys import BlockHash, PageKey
from pipeline.core.storage import StorageKind
from pipeline.engine.events.publisher import BlockRemoved, BlockStored, KvEvent, block_hash

KEPT_PAGES = 100_000
"""Pages whose names are remembered for later events (the least recent forgotten): a store
eviction names its objects by key alone."""
UINT64 = (1 << 64) - 1
INT64_MIN = -(1 << 63)
SGLANG_HEX = re.compile(r"[0-9a-fA-F]{16}")
"""The head of an SGLang block hash (a SHA-256 hex string), whose int64 its events carry."""

Medium = tuple[str, str | None]
"""An event's `medium` and `locality` (vLLM's, for its `STORAGE`; else None)."""
MEDIA: dict[EventsMedia, dict[StorageKind | None, Medium]] = {
    EventsMedia.sglang: {
        None: ("CPU_PINNED", None),
        StorageKind.file: ("DISK", None),
        StorageKind.mooncake: ("EXTERNAL", None),
    },
    EventsMedia.vllm: {
        None: ("CPU", None),
        StorageKind.file: ("STORAGE", "LOCAL"),
        StorageKind.mooncake: ("STORAGE", "REMOTE"),
    },
}
"""Each consumer's names for the host tier (None) and each store."""


def wire_hash(given: BlockHash, key: str) -> int:
    """An engine's block hash as its own events send it: an int as given (its low 64 bits
    where it does not fit msgpack), an SGLang hex string as SGLang's int64 (its first 16
    digits, signed), vLLM's bytes as vLLM's int (their low 64 bits, unsigned: what vLLM
    sends unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0). A string that is not hex has no
    engine form: the key's hash."""
    if isinstance(given, int):
        return given if INT64_MIN <= given <= UINT64 else given & UINT64
    if isinstance(given, bytes):
        return int.from_bytes(given, "big") & UINT64
    return block_hash(given if SGLANG_HEX.match(given) else key)  # the same first 64 bits


@dataclass(frozen=True)
class Name:
    """A page's name in the events: its hash, its parent's (`chained`: known, None the
    first page's) and its token ids (None: not known)."""

    hash: int
    parent: int | None
    chained: bool
    token_ids: tuple[int, ...] | None


class PageNames:
    """The names of the last `KEPT_PAGES` pages the events were told of, and the events
    that name them."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._known: OrderedDict[str, Name] = OrderedDict()

    def keyed(self, keys: Sequence[str], tokens: Sequence[int]) -> None:
        """`Engine.l3_keys` made `keys` of `tokens`, each folding in the one before it."""
        size, parent = self.block_size, None
        for i, key in enumerate(keys):
            own = block_hash(key)
            ids = tuple(tokens[i * size : (i + 1) * size])
            self._remember(key, Name(own, parent, True, ids))
            parent = own

    def stored(self, keys: Sequence[str], medium: Medium) -> list[KvEvent]:
        """One `BlockStored` per run of `keys` that chains (each page's parent the one
        before it), or per run of pages of unknown parents."""
        events: list[KvEvent] = []
        names = [self.name(k) for k in keys]
        start = 0
        for end in range(1, len(names) + 1):
            if end == len(names) or _breaks(names[end - 1], names[end]):
                events.append(self._stored(names[start:end], medium))
                start = end
        return events

    def removed(self, keys: Sequence[str], medium: Medium) -> BlockRemoved:
        return BlockRemoved([self.name(k).hash for k in keys], medium[0], medium[1])

    def name(self, key: str) -> Name:
        """`key`'s name: its own where it is a `PageKey`, else the one remembered, else its
        hash alone."""
        if isinstance(key, PageKey):
            parent = None if key.parent is None else wire_hash(key.parent, key)
            own = Name(wire_hash(key.block_hash, key), parent, True, key.token_ids)
            self._remember(key, own)
            return own
        known = self._known.get(key)
        return known if known is not None else Name(block_hash(key), None, False, None)

    def _remember(self, key: str, name: Name) -> None:
        self._known[str(key)] = name
        self._known.move_to_end(str(key))
        while len(self._known) > KEPT_PAGES:
            self._known.popitem(last=False)

    def _stored(self, run: Sequence[Name], medium: Medium) -> BlockStored:
        known = [n.token_ids for n in run]
        tokens = [t for ids in known for t in ids or ()] if all(known) else []
        hashes = [n.hash for n in run]
        size, (where, locality) = self.block_size, medium
        return BlockStored(hashes, run[0].parent, tokens, size, None, where, None, locality)


def _breaks(before: Name, after: Name) -> bool:
    """Whether `after` starts another run: a chained page whose parent is not `before`, or
    a change between chained and unknown pages."""
    if after.chained != before.chained:
        return True
    return after.chained and after.parent != before.hash
