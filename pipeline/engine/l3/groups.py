"""Where a streamed load cuts a page's layers into groups, and where a store that reads whole
objects faster than parts of them cuts a page's object into pieces to match
(`ObjectStore.cut`, `cut_store`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pipeline.core.l3 import PageObject
from pipeline.core.model import Unit
from pipeline.engine.l3.stores import ObjectStore

AUTO_GROUPS = 8
"""Groups a load streams in where `storage.stream_layers` is null and streaming pays."""


def auto_per_group(num_layers: int) -> int:
    """Layers a group where `storage.stream_layers` is null: an AUTO_GROUPS-th of them."""
    return -(-num_layers // AUTO_GROUPS)


def group_starts(num_layers: int, per_group: int) -> Sequence[int]:
    """Where a streamed load's later groups start: the first layer alone, then `per_group`."""
    return range(1, num_layers, per_group)


def layer_groups(units: tuple[Unit, ...], starts: Sequence[int]) -> list[tuple[Unit, ...]]:
    """`units` by the groups of layers `starts` (increasing: `group_starts`) begin, in order."""
    found: list[list[Unit]] = [[] for _ in range(len(starts) + 1)]
    for u in units:
        found[bisect.bisect_right(starts, u.layer)].append(u)
    return [tuple(group) for group in found]


def piece_cuts(obj: PageObject, per_group: int) -> list[int]:
    """Where a page's payload passes from one group of `per_group` layers (`group_starts`) to
    another: where a store that gets whole objects faster than parts of them cuts it
    (`cut_store`), so that each group reads whole pieces."""
    num_layers = 1 + max(u.layer for u in obj.units)
    starts = group_starts(num_layers, per_group)
    group = [bisect.bisect_right(starts, u.layer) for u in obj.units]  # in the payload's order
    return [
        obj.offsets[u.ordinal]
        for u, before, now in zip(obj.units[1:], group, group[1:], strict=False)
        if now != before
    ]


def cut_store(store: ObjectStore, space: str, obj: PageObject, stream_layers: int | None) -> None:
    """Tell `store` where `space`'s objects are cut (`ObjectStore.cut`): at the groups an
    explicit `storage.stream_layers` streams, so a store that gets whole objects faster than
    parts of them (Mooncake) keeps each group an object of its own; none where it is null or
    0. Every writer and reader of the space (the engine's ranks, the SGLang backend, a
    scheduler's store view) cuts alike from the same config: one stored form."""
    if stream_layers:
        store.cut(space, obj.page_bytes, piece_cuts(obj, stream_layers))
