"""What one rank's host tier and L3 store hold, said as KV events as the engine's calls
release (see `pipeline.engine.events`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pipeline.core.checks import raise_problems
from pipeline.core.events import EventsConfig, engine_of, port_problems
from pipeline.core.l3 import check_keys
from pipeline.core.l3_keys import object_keys
from pipeline.core.model import ModelGeometry
from pipeline.core.slots import PageAllocator
from pipeline.core.storage import StorageConfig
from pipeline.core.topology import Topology
from pipeline.engine.acks import Ack
from pipeline.engine.cuda.streams import Event
from pipeline.engine.events.names import MEDIA, Medium, PageNames
from pipeline.engine.events.publisher import AllBlocksCleared, KvEvent, Publisher
from pipeline.engine.l3.stores import ObjectStore
from pipeline.engine.l3.tier import L3Tier


class Landing(Protocol):
    """A load's handle, as far as its events read it."""

    @property
    def num_layers(self) -> int: ...

    def ready(self, layer: int) -> bool: ...


class KvEvents:
    """What one publishing rank's tiers hold, said as events: host pages by the key of the
    page each holds (known from a backup or a write-back that named it, or a load from L3),
    L3 objects as their write-backs are acked and their evictions seen."""

    def __init__(
        self, publisher: Publisher, names: PageNames, host: Medium, l3: Medium | None
    ) -> None:
        self.publisher, self.names = publisher, names
        self.host_medium, self.l3_medium = host, l3
        self.host: dict[int, str] = {}
        """Host page -> the key of the page it holds."""
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
        self.names.keyed(keys, tokens)

    def host_stored(self, pages: Sequence[int], keys: Sequence[str]) -> None:
        """Host `pages` hold `keys`' pages now (a page named again with its key says
        nothing new)."""
        new = [(p, k) for p, k in zip(pages, keys, strict=True) if self.host.get(p) != k]
        gone = [self.host[p] for p, _ in new if p in self.host]
        self.host.update(new)
        events: list[KvEvent] = [self.names.removed(gone, self.host_medium)] if gone else []
        if new:
            events += self.names.stored([k for _, k in new], self.host_medium)
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
            self.publisher.publish([self.names.removed(gone, self.host_medium)])

    def l3_stored(self, keys: Sequence[str]) -> None:
        if keys and self.l3_medium is not None:
            self.publisher.publish(self.names.stored(keys, self.l3_medium))

    def l3_removed(self, keys: Sequence[str]) -> None:
        """The store evicted `keys`' objects (called on the write-back thread)."""
        if keys and self.l3_medium is not None:
            self.publisher.publish([self.names.removed(keys, self.l3_medium)])

    def close(self) -> None:
        if self._listening is not None:  # a store the caller opened outlives the engine
            store, listener = self._listening
            store.counters.listeners.remove(listener)
        self.publisher.close()


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
    place: Place,
    *,
    per_rank: bool,
) -> KvEvents | None:
    """This rank's events, or None where it publishes none: events=none, or a rank after the
    first of its replica group when the group holds one copy of its state (`per_rank`
    False: single_source, rotating). Publisher j of the engine at data-parallel rank d binds
    the endpoints' ports + d x P + j (P: the engine's publishers; j: the rank with
    `per_rank`, else the replica group's index); its batches' dp_rank is d x A + the
    attention group's (A: the engine's attention groups). Every rank checks the ports of
    the world's engines first, all on this config (ConfigError alike on each). The store's
    events come from the group's first rank alone: it writes the group's objects and evicts
    to make room, so it sees both."""
    if not config.on:
        return None
    publishers = engine_publishers(topology, model, per_rank=per_rank)
    engine = engine_of(config, place.first_rank, topology.tp_size)
    engines = range(max(engine + 1, place.world_size // topology.tp_size))  # one config
    raise_problems(port_problems(config, publishers, engines, place.metrics))
    rank = place.rank
    replica = topology.replica_group(rank, model)
    writer = rank == replica[0]
    if not per_rank and not writer:
        return None
    index = rank if per_rank else topology.replica_groups(model).index(replica)
    groups = topology.tp_size // topology.attn_tp_size
    publisher = Publisher(
        config, engine * publishers + index, engine * groups + rank // topology.attn_tp_size
    )
    media = MEDIA[config.media]
    l3 = media.get(storage.kind) if writer and storage.attached else None
    names = PageNames(model.page_size * topology.dcp_size)
    return KvEvents(publisher, names, media[None], l3)


def engine_publishers(topology: Topology, model: ModelGeometry, *, per_rank: bool) -> int:
    """Publishers of one engine: one a rank (`per_rank`), else one a replica group."""
    return topology.tp_size if per_rank else len(topology.replica_groups(model))


@dataclass(frozen=True)
class Place:
    """Where an engine's rank stands in the world, for its publisher's ports."""

    rank: int
    """Its TP rank."""
    first_rank: int
    """The engine's first global rank."""
    world_size: int
    metrics: range | None
    """The ports the world's ranks serve metrics on (None: none)."""
