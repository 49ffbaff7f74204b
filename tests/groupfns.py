"""Engines on the caller's groups: several engines in one world, each on its own TP group
(DP replicas, pipeline stages), through the public API (`pipeline.create_engine(job,
group=...)`) and the API grid's round trip (`gridfns.round_trip`).

Spawned ranks import it by name (tests/ is on sys.path, and spawn hands it on).
"""

from __future__ import annotations

from dataclasses import dataclass

import gridfns
import torch
import torch.distributed as dist

import pipeline


@dataclass(frozen=True)
class Layout:
    """Engines sharing one world: each engine's global ranks and its cases in turn (jobs
    composed in the parent); `cpu_groups`: hand each engine the caller's gloo group too."""

    ranks: list[list[int]]
    cases: list[list[tuple[gridfns.Case, pipeline.Job]]]
    cpu_groups: bool = False


def caller_groups(ranks: list[list[int]]) -> list[dist.ProcessGroup]:
    """The caller's group of each engine, this rank's among them (every rank makes every
    group, in the same order, as a serving engine makes its TP groups)."""
    return [dist.new_group(members, backend="gloo") for members in ranks]


def on_caller_groups(
    layouts: list[Layout], rank: int, world_size: int, local_rank: int
) -> list[list[str]]:
    """Per layout, this rank's engine's cases: '' where the round trip was bit-exact, else
    the first difference; then 'usable' where the caller's groups still sum a tensor after
    every engine closed."""
    found = []
    for layout in layouts:
        engine_index = next(i for i, members in enumerate(layout.ranks) if rank in members)
        group = caller_groups(layout.ranks)[engine_index]
        # the caller's gloo twin of its TP group, as SGLang and vLLM keep one
        cpu_group = caller_groups(layout.ranks)[engine_index] if layout.cpu_groups else None
        said = [
            engine_round_trip(case, job, group, cpu_group, salt=engine_index)
            for case, job in layout.cases[engine_index]
        ]
        found.append([*said, usable(group, cpu_group, len(layout.ranks[engine_index]))])
    return found


def engine_round_trip(
    case: gridfns.Case,
    job: pipeline.Job,
    group: dist.ProcessGroup,
    cpu_group: dist.ProcessGroup | None,
    *,
    salt: int,
) -> str:
    kv = gridfns.adopted_kv(job, case.adopted, case.device)
    try:
        engine = pipeline.create_engine(job, group=group, cpu_group=cpu_group, device_kv=kv)
        try:
            return gridfns.round_trip(engine, job, case, gridfns.layers(engine, job, kv), salt=salt)
        finally:
            engine.close()
    except Exception as e:
        e.add_note(f"in case {case} of the engine {dist.get_process_group_ranks(group)}")
        raise


def usable(group: dist.ProcessGroup, cpu_group: dist.ProcessGroup | None, size: int) -> str:
    """'usable' where both of the caller's groups still sum a tensor over their ranks."""
    sums = []
    for each in (group, cpu_group or group):
        one = torch.ones(1)
        dist.all_reduce(one, group=each)
        sums.append(int(one.item()))
    return "usable" if sums == [size, size] else f"sums {sums} over {size} ranks"


def refusals(job: pipeline.Job, rank: int, world_size: int, local_rank: int) -> list[str]:
    """What create_engine says, for a tp1 job, to the whole world as `group` (2 ranks), to a
    cpu_group over other ranks than `group`, and to the default group of 2 ranks."""
    world = dist.new_group(list(range(world_size)), backend="gloo")
    mine = caller_groups([[r] for r in range(world_size)])[rank]
    said = []
    for group, cpu_group in ((world, None), (mine, world), (None, None)):
        try:
            pipeline.create_engine(job, group=group, cpu_group=cpu_group).close()
            said.append("")
        except ValueError as e:
            said.append(str(e))
    return said


def beside_another_group(
    cases: list[tuple[gridfns.Case, pipeline.Job]], rank: int, world_size: int, local_rank: int
) -> list[str]:
    """In a world of 3, a TP group [0, 1] whose rank 1 is also in a group [1, 2] made before
    it (a rank in a TP group and a PP or DP group holds more groups than its TP peer): the
    engine on [0, 1] runs each case ('' where bit-exact), made again after each close; then
    'usable' for each of the caller's groups this rank is in."""
    other, tp = caller_groups([[1, 2], [0, 1]])
    said = []
    if rank in (0, 1):
        said = [engine_round_trip(case, job, tp, None, salt=0) for case, job in cases]
        said.append(usable(tp, None, 2))
    if rank in (1, 2):
        said.append(usable(other, None, 2))
    return said


def one_rank_missing(job: pipeline.Job, rank: int, world_size: int, local_rank: int) -> dict:
    """Rank 1 does not call create_engine: what rank 0's says, and whether both ranks make
    an engine together afterwards ('' on rank 1, which never failed)."""
    said = ""
    if rank == 0:
        try:
            pipeline.create_engine(job).close()
        except RuntimeError as e:
            said = str(e)
    dist.barrier()  # rank 1 waits here until rank 0 has its error
    pipeline.create_engine(job).close()  # rank 0's failed call was taken back
    return {"said": said, "again": "made"}
