"""A scheduler's view of the L3 store: which prefixes the ranks can load from it, asked by a
process that has no rank, no process group and no engine (the scheduler of vLLM or SGLang).

It asks the question `Engine.lookup` asks, of the same objects: each replica group's readers
look for the object of their group's share of the KV (`PageObject.name`: one per page, or one
per share where the group holds part of it), and every replica group has a reader (its first
rank at least), so the pages every rank's lookup finds are the leading pages whose objects
are there for every share of the topology.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import numpy as np

from pipeline.core.l3 import (
    PageObject,
    check_keys,
    largest_object,
    namespace,
    prefix_keys,
    share_of,
)
from pipeline.core.l3_keys import key_list
from pipeline.core.model import ModelGeometry
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import Topology
from pipeline.engine.l3.groups import cut_store
from pipeline.engine.l3.stores import MooncakeStore, ObjectStore, open_store

ASKING_BYTES = 1 << 20
"""A Mooncake client's buffers where it only asks whether objects are there (its least)."""


class StoreView:
    """What the ranks of one job can load from its L3 store, without a process group: a
    lookup here is local (no collective), and reads no object, only asks whether it is there.
    What it reports present is what a following `Engine.load_from_l3` of the same keys finds,
    unless it is evicted (or removed) in between."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        space: str,
        objects: Sequence[PageObject],
        slots_per_page: int,
        min_hit_pages: int,
    ) -> None:
        self.store = store
        self.space = space
        """The job's namespace (`pipeline.core.l3.namespace`): what its ranks write under."""
        self.objects = tuple(objects)
        """A page's object for each share of the KV that a replica group holds."""
        self.slots_per_page = slots_per_page
        """Token ids per page (page_size x dcp_size)."""
        self.min_hit_pages = min_hit_pages
        """storage.min_hit_pages: fewer leading pages found report 0, as `Engine.lookup`."""

    def keys(self, tokens: Sequence[int] | np.ndarray) -> list[str]:
        """One page key per page of a prefix's token ids, as `Engine.l3_keys` makes them."""
        return prefix_keys(tokens, self.slots_per_page, self.space)

    def lookup(self, keys: list[str]) -> int:
        """Pages at the front of `keys` whose objects every replica group finds: what
        `Engine.lookup` answers on every rank (0 below `storage.min_hit_pages`, as there);
        ValueError where `keys` is not a list of page keys."""
        check_keys(keys := key_list(keys), len(keys))
        found = len(keys)
        for obj in self.objects:
            present = self.store.exists([obj.name(self.space, k) for k in keys[:found]])
            found = present.index(False) if False in present else found
        return found if found >= self.min_hit_pages else 0

    def contains(self, key: str) -> bool:
        """Whether one page's objects are all there (every share of it)."""
        check_keys([key], 1)
        return all(self.store.exists([obj.name(self.space, key) for obj in self.objects]))

    def close(self) -> None:
        """Let go of the store (a Mooncake client, a file store's folder)."""
        self.store.close()

    def __enter__(self) -> StoreView:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def open_view(
    model: ModelGeometry, topology: Topology, storage: StorageConfig, *, timeout_s: float
) -> StoreView:
    """The view of the store `storage` names (its folder or master given), for the ranks of
    `topology` serving `model`; a wait on its lock or master lasts at most `timeout_s`."""
    space = namespace(model, storage.model_revision, storage.tenant)
    shares = sorted({share_of(topology, model, rank) for rank in range(topology.world_size)})
    if storage.kind is StorageKind.mooncake:
        assert storage.metadata_server is not None, "the caller gives the master"
        # it only asks whether objects are there: it lends the store no memory of its own
        store: ObjectStore = MooncakeStore(
            storage.master,
            storage.metadata_server,
            0,
            ASKING_BYTES,
            staging_bytes=ASKING_BYTES,
            num_staging=1,
            timeout_s=timeout_s,
        )
    else:
        store = open_store(storage, largest_object(model), timeout_s=timeout_s)
    cut_store(store, space, PageObject("", model.units), storage.stream_layers)  # as the ranks
    return StoreView(
        store,
        space=space,
        objects=[PageObject(share, model.units) for share in shares],
        slots_per_page=model.page_size * topology.dcp_size,
        min_hit_pages=storage.min_hit_pages,
    )
