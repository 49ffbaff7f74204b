"""Who moves which layer: replicated, single_source and rotating maps over a replica group.

A replica group is the set of ranks that hold the same KV bytes (the attention-TP group, or its
ranks of one DCP shard; see `Topology.replica_group`). With DP attention each attention group
rotates independently, because each is its own replica group.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pipeline.core.model import Unit


class Ownership(Enum):
    """Which rank of a replica group moves each unit."""

    replicated = "replicated"
    single_source = "single_source"
    rotating = "rotating"


class Role(Enum):
    """What a rank does with one unit in a load-back's exchange: nothing (replicated: it
    copies its own; or a group of one), send it (its owner), or receive it (every other)."""

    none = "none"
    send = "send"
    receive = "receive"


@dataclass(frozen=True)
class OwnerMap:
    """For one replica group: the rank that moves each unit, or None where every rank does."""

    group: tuple[int, ...]
    """Global ranks of the replica group, in rank order."""
    sources: tuple[int | None, ...]
    """Indexed by unit ordinal: the owner's global rank, or None (replicated: each rank)."""

    def copies(self, ordinal: int, rank: int) -> bool:
        """Does `rank` copy this unit between its own device and host pools?"""
        source = self.sources[ordinal]
        return source is None or source == rank

    def exchanged(self, ordinal: int) -> bool:
        """Is this unit broadcast from its owner to the rest of the group?"""
        return self.sources[ordinal] is not None and len(self.group) > 1

    def role(self, ordinal: int, rank: int) -> Role:
        if not self.exchanged(ordinal):
            return Role.none
        return Role.send if self.sources[ordinal] == rank else Role.receive

    def owned(self, rank: int, units: tuple[Unit, ...]) -> tuple[Unit, ...]:
        """The units `rank` copies, in ordinal order."""
        return tuple(u for u in units if self.copies(u.ordinal, rank))


def owner_map(ownership: Ownership, group: tuple[int, ...], units: tuple[Unit, ...]) -> OwnerMap:
    """KV layer i -> group[i % n]; index-K layer j (ordinal num_layers + j) likewise."""
    if ownership is Ownership.replicated:
        sources: tuple[int | None, ...] = tuple(None for _ in units)
    elif ownership is Ownership.single_source:
        sources = tuple(group[0] for _ in units)
    else:
        sources = tuple(group[u.ordinal % len(group)] for u in units)
    return OwnerMap(group=group, sources=sources)
