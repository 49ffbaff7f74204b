"""Which ranks an engine is made of, how they meet, and the groups they make.

An engine lives on one attention-TP group: the caller's (a serving engine's tp_group), or the
whole default group. Its TP rank r is the group's rank r; `engine_ranks` maps TP ranks to
global ranks. Its ranks meet under a prefix of the default store that the engine names
itself, "hicache-pipeline/<global ranks>/<n>", where n counts this rank's create_engine calls
on those ranks (kept in the store: the nth call is the same n on every rank, and no process
keeps state of its own). Each group the engine makes is built there from torch's public
constructors, so no rank's count of groups enters its name: torch names a group made with
local synchronization after the groups the process holds, which differ between a TP rank
that is also in a PP or DP group and one that is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import cast

import torch
import torch.distributed as dist

from pipeline.core.topology import Topology
from pipeline.engine.comms import Comm, Group

PREFIX = "hicache-pipeline"
"""The default store's keys of every engine begin with it."""


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
    """The groups an engine runs on, and its prefix in the default store."""

    transfer: Group | None
    """The replica group's, for broadcasts (None when it has one rank)."""
    cpu: Group
    """Gloo, for host-side agreement: the caller's `cpu_group`, or one made."""
    l3: Group
    """Gloo, for the L3 write-back thread."""
    made: tuple[Group, ...]
    """The ones made here, which the engine closes as it closes (never the caller's)."""
    store: dist.Store
    prefix: str
    """This engine's keys in `store` (`join`)."""


def default_store() -> dist.Store:
    """The default group's store (every rank of the world reaches it)."""
    world = dist.group.WORLD
    assert world is not None, "create_engine checks that the default group exists"
    return world.get_group_store()


def join(store: dist.Store, ranks: tuple[int, ...], timeout_s: float) -> str:
    """Meet the engine's other ranks: this rank's prefix for its create_engine call on
    `ranks` (the same on each of them). RuntimeError naming the ranks that did not come
    within `timeout_s`; this rank's call is then taken back, so its next one meets theirs."""
    on, me = f"{PREFIX}/{','.join(map(str, ranks))}", dist.get_rank()
    calls = f"{on}/calls/"
    call = store.add(calls + str(me), 1)
    prefix = f"{on}/{call}"
    store.set(f"{prefix}/joined/{me}", "")
    try:
        store.wait([f"{prefix}/joined/{r}" for r in ranks], timedelta(seconds=timeout_s))
    except RuntimeError as e:  # DistStoreError, or a FileStore's RuntimeError
        missing = [r for r in ranks if not store.check([f"{prefix}/joined/{r}"])]
        store.delete_key(f"{prefix}/joined/{me}")
        store.add(calls + str(me), -1)
        if not missing:  # every rank came as the wait ended: a store failure of its own
            raise
        made = "; ".join(f"rank {r} has made {store.add(calls + str(r), 0)}" for r in missing)
        raise RuntimeError(
            f"create_engine on ranks {list(ranks)}: rank(s) {', '.join(map(str, missing))} "
            f"did not call it within runtime.timeout_s={timeout_s:g} s. create_engine is a "
            "collective over the group: every rank of it must call it, as often and in the "
            f"same order (this rank, rank {me}, is at its call #{call} on these ranks; {made})"
        ) from e
    return prefix


def make_groups(
    ranks: tuple[int, ...],
    replica: tuple[int, ...],
    *,
    cpu_group: dist.ProcessGroup | None,
    device: torch.device,
    backend: str,
    timeout_s: float,
) -> EngineGroups:
    """The engine's groups, once every one of its `ranks` has joined: the transfer group of
    this rank's `replica` (TP ranks), then the gloo ones, each on its own prefix, so only
    their own members take part."""
    store = default_store()
    prefix = join(store, ranks, timeout_s)
    made: list[Group] = []

    def made_of(purpose: str, members: tuple[int, ...], backend: str) -> Group:
        group = build(store, f"{prefix}/{purpose}", members, backend, timeout_s)
        made.append(group)
        return group

    try:
        transfer = None
        if len(replica) > 1:
            members = tuple(ranks[r] for r in replica)
            transfer = made_of(f"transfer-{','.join(map(str, members))}", members, backend)
            if device.type == "cuda":
                # NCCL makes a communicator on its first collective, which must not be one
                # that a CUDA graph captures
                transfer.broadcast(torch.zeros(1, device=device), 0)
        if cpu_group is None:
            cpu = made_of("cpu", ranks, "gloo")
        else:
            cpu = Group.theirs(cpu_group, timeout_s)
        l3 = made_of("l3", ranks, "gloo")
        cpu.barrier()  # every rank holds every group before any may close one
    except BaseException:
        for group in made:
            group.close()
        raise
    return EngineGroups(transfer, cpu, l3, tuple(made), store, prefix)


def build(
    store: dist.Store, prefix: str, members: tuple[int, ...], backend: str, timeout_s: float
) -> Group:
    """A group of global ranks `members` that meet under `prefix`; this rank is one of them."""
    keys, timeout = dist.PrefixStore(f"{prefix}/", store), timedelta(seconds=timeout_s)
    at, size = members.index(dist.get_rank()), len(members)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # as torch's own new_group sets it
        comm: object = dist.ProcessGroupNCCL(keys, at, size, options)
    else:
        comm = dist.ProcessGroupGloo(keys, at, size, timeout)
    # a Backend has the collectives of a ProcessGroup, though torch's stubs declare them on
    # ProcessGroup alone
    return Group(cast(Comm, comm), members, made=True, timeout_s=timeout_s)
