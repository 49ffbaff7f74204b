"""What one rank's host tier and L3 store hold, said as KV events as the engine's calls
release (see `pipeline.engine.events`)."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from pipeline.core.events import EventsConfig
from pipeline.core.l3 import check_keys
from pipeline.core.l3_keys import object_keys
from pipeline.core.model import ModelGeometry
from pipeline.core.slots import PageAllocator
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import Topology
from pipeline.engine.acks import Ack
from pipeline.engine.cuda.streams import Event
from pipeline.engine.events.publisher import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    Publisher,
    block_hash,
)
from pipeline.engine.l3.stores import ObjectStore
from pipeline.engine.l3.tier import L3Tier

HOST_MEDIUM = "CPU_PINNED"
L3_MEDIUM = {StorageKind.file: "DISK", StorageKind.mooncake: "EXTERNAL"}
KEPT_TOKENS = 100_000
"""Pages whose token ids are kept for their `BlockStored` (the least recent forgotten)."""


class Landing(Protocol):
    """A load's handle, as far as its events read it."""

    @property
    def num_layers(self) -> int: ...

    def ready(self, layer: int) -> bool: ...


class KvEvents:
    """What one publishing rank's tiers hold, said as events: host pages by the key of the
    page each holds (known from a backup or a write-back that named it, or a load from L3),
    L3 objects as their write-backs are acked and their evictions seen."""

    def __init__(self, publisher: Publisher, page_size: int, l3_medium: str | None) -> None:
        self.publisher, self.page_size, self.l3_medium = publisher, page_size, l3_medium
        self.host: dict[int, str] = {}
        """Host page -> the key of the page it holds."""
        self._tokens: OrderedDict[str, list[int]] = OrderedDict()
        self._landing: list[tuple[Landing, list[int], list[str]]] = []
        self._listening: tuple[ObjectStore, Callable[[list[str]], None]] | None = None
        publisher.publish([AllBlocksCleared()])

    def landing(self, handle: Landing | None, pages: Sequence[int], keys: Sequence[str]) -> None:
        """A load from L3 read `keys`' pages intact into host `pages`: said once `handle`
        (its device copies, after the reads) completes (`released`)."""
        if handle is not None and keys:
            self._landing.append((handle, list(pages), list(keys)))

    def released(self, acks: Sequence[Ack]) -> None:
        """What `Engine.poll` released: each ack's payload (a page stored) unless its
        transfer failed, then the loads from L3 that have landed by now."""
        for ack in acks:
            if ack.payload is not None and succeeded(ack.event):
                ack.payload()
        waiting = []
        for handle, pages, keys in self._landing:
            if all(handle.ready(layer) for layer in range(handle.num_layers)):
                self.host_stored(pages, keys)
            else:
                waiting.append((handle, pages, keys))
        self._landing = waiting

    def watch(self, slots: PageAllocator, tier: L3Tier | None) -> None:
        """Hear of `slots`' frees (host evictions) and of the store's evictions of `tier`'s
        objects, until `close`."""
        slots.freed = self.host_freed
        if tier is not None:
            space = tier.space
            self._listening = (tier.store, lambda names: self.l3_removed(object_keys(space, names)))
            tier.store.counters.listeners.append(self._listening[1])

    def keyed(self, keys: Sequence[str], tokens: Sequence[int]) -> None:
        """`Engine.l3_keys` made `keys` of `tokens`: each page's token ids, for its events."""
        size = self.page_size
        for i, key in enumerate(keys):
            self._tokens[key] = list(tokens[i * size : (i + 1) * size])
            self._tokens.move_to_end(key)
        while len(self._tokens) > KEPT_TOKENS:
            self._tokens.popitem(last=False)

    def host_stored(self, pages: Sequence[int], keys: Sequence[str]) -> None:
        """Host `pages` hold `keys`' pages now (a page named again with its key says
        nothing new)."""
        new = [(p, k) for p, k in zip(pages, keys, strict=True) if self.host.get(p) != k]
        gone = [self.host[p] for p, _ in new if p in self.host]
        self.host.update(new)
        events: list[KvEvent] = [self._removed(gone, HOST_MEDIUM)] if gone else []
        if new:
            events.append(self._stored([k for _, k in new], HOST_MEDIUM))
        if events:
            self.publisher.publish(events)

    def written_back(
        self, pages: Sequence[int], keys: Sequence[str], stored: Sequence[str]
    ) -> Callable[[], None]:
        """What a write-back's release says: host `pages` hold `keys`' pages, the store holds
        `stored` (the pages write admission let through)."""

        def said() -> None:
            self.host_stored(pages, keys)
            self.l3_stored(stored)

        return said

    def host_freed(self, pages: Sequence[int]) -> None:
        """Host `pages` were freed: the pages they held are gone from the host tier."""
        gone = [self.host.pop(p) for p in pages if p in self.host]
        if gone:
            self.publisher.publish([self._removed(gone, HOST_MEDIUM)])

    def l3_stored(self, keys: Sequence[str]) -> None:
        if keys and self.l3_medium is not None:
            self.publisher.publish([self._stored(keys, self.l3_medium)])

    def l3_removed(self, keys: Sequence[str]) -> None:
        """The store evicted `keys`' objects (called on the write-back thread)."""
        if keys and self.l3_medium is not None:
            self.publisher.publish([self._removed(keys, self.l3_medium)])

    def close(self) -> None:
        if self._listening is not None:  # a store the caller opened outlives the engine
            store, listener = self._listening
            store.counters.listeners.remove(listener)
        self.publisher.close()

    def _stored(self, keys: Sequence[str], medium: str) -> BlockStored:
        known = [self._tokens.get(k) for k in keys]
        tokens = [t for page in known for t in page or ()] if all(known) else []
        hashes = [block_hash(k) for k in keys]
        return BlockStored(hashes, None, tokens, self.page_size, None, medium, None)

    @staticmethod
    def _removed(keys: Sequence[str], medium: str) -> BlockRemoved:
        return BlockRemoved([block_hash(k) for k in keys], medium)


Keys = Sequence[str] | None
"""A page key per page (optional: names the pages in KV events)."""


def backed_up(events: KvEvents | None, pages: np.ndarray, keys: Keys) -> Callable[[], None] | None:
    """What a backup's release says: host `pages` hold `keys`' pages (checked first, events
    or none: a bad argument is refused alike)."""
    if keys is None:
        return None
    check_keys(keys, len(pages))
    return None if events is None else functools.partial(events.host_stored, pages.tolist(), keys)


def succeeded(event: Event) -> bool:
    """Whether a released ack's transfer succeeded (its event, complete, re-raises an error)."""
    try:
        event.wait()
    except Exception:
        return False
    return True


def open_events(
    config: EventsConfig,
    storage: StorageConfig,
    topology: Topology,
    model: ModelGeometry,
    rank: int,
    *,
    per_rank: bool,
) -> KvEvents | None:
    """This rank's events, or None where it publishes none: events=none, or a rank after the
    first of its replica group when the group holds one copy of its state (`per_rank`
    False: single_source, rotating). Publisher i binds the endpoints' ports + i: i is the
    rank with `per_rank`, else the replica group's index; dp_rank is the attention group's.
    The store's events come from the group's first rank alone: it writes the group's objects
    and evicts to make room, so it is the one that sees both."""
    replica = topology.replica_group(rank, model)
    writer = rank == replica[0]
    if not config.on or (not per_rank and not writer):
        return None
    index = rank if per_rank else topology.replica_groups(model).index(replica)
    publisher = Publisher(config, index, rank // topology.attn_tp_size)
    medium = L3_MEDIUM.get(storage.kind) if writer else None
    return KvEvents(publisher, model.page_size * topology.dcp_size, medium)
