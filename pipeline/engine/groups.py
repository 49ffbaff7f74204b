"""Which ranks an engine is made of, and what its groups leave behind in the store.

An engine lives on one attention-TP group: the caller's (a serving engine's tp_group), or the
whole default group. Its TP rank r is the group's rank r; `engine_ranks` maps TP ranks to the
global ranks torch's `src=` / `dst=` take.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist
from torch.distributed import distributed_c10d

from pipeline.spec.topology import Topology


def engine_ranks(
    topology: Topology, group: dist.ProcessGroup | None, cpu_group: dist.ProcessGroup | None
) -> tuple[int, ...]:
    """The global rank of each TP rank: `group`'s ranks (None: the default group's); a
    ValueError naming the fix where they do not fit the topology or `cpu_group`."""
    if group is None:
        world = dist.get_world_size()
        if world != topology.tp_size:
            raise ValueError(
                f"{world} ranks joined but topology.tp_size={topology.tp_size}: launch one "
                "process per TP rank of one pipeline stage, or pass create_engine the group of "
                "the ranks that hold the same KV (group=your attention-TP group)"
            )
        ranks = tuple(range(world))
    else:
        ranks = tuple(dist.get_process_group_ranks(group))
        if len(ranks) != topology.tp_size:
            raise ValueError(
                f"group has {len(ranks)} ranks {list(ranks)} but topology.tp_size="
                f"{topology.tp_size}: pass the attention-TP group (the ranks that hold the "
                "same KV), or compose the job with its size"
            )
        if list(ranks) != sorted(ranks):
            raise ValueError(
                f"group's ranks {list(ranks)} are not in increasing order: make it with sorted "
                "ranks (new_group sorts them unless sort_ranks=False)"
            )
    if dist.get_rank() not in ranks:
        raise ValueError(f"rank {dist.get_rank()} is not in group {list(ranks)}")
    if cpu_group is not None:
        theirs = tuple(dist.get_process_group_ranks(cpu_group))
        if theirs != ranks:
            raise ValueError(
                f"cpu_group has ranks {list(theirs)} but group has {list(ranks)}: pass a gloo "
                "group over the same ranks, or none (the engine makes its own)"
            )
        if dist.get_backend(cpu_group) != "gloo":
            raise ValueError(
                f"cpu_group's backend is {dist.get_backend(cpu_group)}: pass a gloo group, or "
                "none (the engine makes its own)"
            )
    return ranks


def forget_rendezvous(groups: Sequence[dist.ProcessGroup]) -> None:
    """Delete the store keys `groups`' ranks met by, once all of them hold every group.

    torch names a group made with local synchronization by its ranks and the number of groups
    this process holds (torch 2.13, fixed upstream by pytorch#189073), so an engine made again
    on the same ranks after `close` gets the same names: the old keys would send its ranks to
    the closed groups' addresses, where they wait out the timeout."""
    store = distributed_c10d._get_default_store()
    prefixes = tuple(f"{group.group_name}/" for group in groups)
    for key in store.list_keys():
        if key.startswith(prefixes):
            store.delete_key(key)
