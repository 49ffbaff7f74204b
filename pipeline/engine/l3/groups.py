"""Where a streamed load cuts a page's layers into groups, and where a store that reads whole
objects faster than parts of them cuts a page's object into pieces to match
(`ObjectStore.cut`)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pipeline.core.l3 import PageObject
from pipeline.core.model import Unit

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


def piece_cuts(obj: PageObject) -> list[int]:
    """Where a page's payload is cut into pieces (`ObjectStore.cut`): wherever it passes from
    one of a streamed load's default groups to another, so that each group reads whole
    pieces (every writer and reader of a space cuts alike: one stored form)."""
    num_layers = 1 + max(u.layer for u in obj.units)
    starts = group_starts(num_layers, auto_per_group(num_layers))
    group = [bisect.bisect_right(starts, u.layer) for u in obj.units]  # in the payload's order
    return [
        obj.offsets[u.ordinal]
        for u, before, now in zip(obj.units[1:], group, group[1:], strict=False)
        if now != before
    ]
