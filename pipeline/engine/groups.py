"""Which ranks an engine is made of, and what its groups leave behind in the store.

An engine lives on one attention-TP group: the caller's (a serving engine's tp_group), or the
whole default group. Its TP rank r is the group's rank r; `engine_ranks` maps TP ranks to the
global ranks torch's `src=` / `dst=` take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from pipeline.core.topology import Topology


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


@dataclass(frozen=True)
class EngineGroups:
    """The groups an engine runs on."""

    transfer: dist.ProcessGroup | None
    """The replica group's, for broadcasts (None when it has one rank)."""
    cpu: dist.ProcessGroup
    """Gloo, for host-side agreement: the caller's `cpu_group`, or one made."""
    l3: dist.ProcessGroup
    """Gloo, for the L3 write-back thread."""
    made: tuple[dist.ProcessGroup, ...]
    """The ones made here, which the engine destroys as it closes (never the caller's)."""


def make_groups(
    ranks: tuple[int, ...],
    replicas: list[tuple[int, ...]],
    replica: tuple[int, ...],
    *,
    cpu_group: dist.ProcessGroup | None,
    device: torch.device,
    backend: str,
    timeout_s: float,
) -> EngineGroups:
    """The engine's groups, made by its `ranks` alone (every one of them makes the same
    groups in the same order: the transfer group of `replica`, this rank's of `replicas`, in
    TP ranks; then the gloo ones)."""
    timeout = timedelta(seconds=timeout_s)
    # where the world holds other engines' ranks too, they need not take part; an engine of
    # the whole world makes its groups as torch names them by default, by a growing count
    local = len(ranks) < dist.get_world_size()

    def made_of(tp_ranks: Sequence[int], backend: str) -> dist.ProcessGroup:
        members = [ranks[r] for r in tp_ranks]
        return dist.new_group(
            members, backend=backend, timeout=timeout, use_local_synchronization=local
        )

    # without local synchronization every rank of the world makes every group
    shared = [g for g in replicas if len(g) > 1 and (g == replica or not local)]
    made = [made_of(g, backend) for g in shared]
    transfer = made[shared.index(replica)] if replica in shared else None
    made = [g for g in made if g is not dist.GroupMember.NON_GROUP_MEMBER]
    if transfer is not None and device.type == "cuda":
        # NCCL makes a communicator on its first collective, which must not be one that a
        # CUDA graph captures
        dist.broadcast(torch.zeros(1, device=device), src=ranks[replica[0]], group=transfer)
    if cpu_group is None:
        cpu_group = made_of(range(len(ranks)), "gloo")
        made.append(cpu_group)
    l3_group = made_of(range(len(ranks)), "gloo")
    made.append(l3_group)
    dist.barrier(group=cpu_group)  # every rank holds every group before any may close one
    if local:
        forget_rendezvous(made)
        dist.barrier(group=cpu_group)  # none makes its next groups before the keys are gone
    return EngineGroups(transfer, cpu_group, l3_group, tuple(made))


def forget_rendezvous(groups: Sequence[dist.ProcessGroup]) -> None:
    """Delete the store keys `groups`' ranks met by, once all of them hold every group (each
    group's by its first rank).

    torch names a group made with local synchronization by its ranks and the number of groups
    this process holds (torch 2.13, fixed upstream by pytorch#189073), so an engine made again
    on the same ranks after `close` gets the same names: the old keys would send its ranks to
    the closed groups' addresses, where they wait out the timeout."""
    store = distributed_c10d._get_default_store()
    firsts = [g for g in groups if dist.get_process_group_ranks(g)[0] == dist.get_rank()]
    prefixes = tuple(f"{group.group_name}/" for group in firsts)
    for key in store.list_keys() if prefixes else ():
        if key.startswith(prefixes):
            store.delete_key(key)
