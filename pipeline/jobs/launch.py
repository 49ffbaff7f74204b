"""One process per rank: spawn local ranks, or join the ranks torchrun started.

Under torchrun (its RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT protocol) this
process is one rank and rank 0 collects every rank's result; otherwise `world_size` local
processes are spawned, watched and collected by the parent (`pipeline.jobs.spawn`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pipeline.jobs.spawn import RankFn, init_backend, spawn

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


def launch(
    fn: RankFn,
    payload: Any,
    world_size: int,
    *,
    backend: str,
    timeout_s: float,
    job_s: float | None = None,
) -> list[Any] | None:
    """Run `fn` on every rank; every rank's result in rank order (None on torchrun ranks > 0).

    `timeout_s` bounds each collective; spawned ranks that report nothing within `job_s`
    (default: timeout_s + 30 s) are stopped. Long jobs (bench) pass a longer `job_s`."""
    if under_torchrun():
        return _join_torchrun(fn, payload, world_size, backend, timeout_s)
    return spawn(fn, payload, world_size, backend, timeout_s, job_s or timeout_s + 30)


def _join_torchrun(
    fn: RankFn, payload: Any, world_size: int, backend: str, timeout_s: float
) -> list[Any] | None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world != world_size:
        raise ValueError(
            f"torchrun started {world} ranks but the topology needs {world_size}: "
            f"pass --nproc-per-node x --nnodes = {world_size}"
        )
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(
        init_backend(backend), init_method="env://", timeout=timedelta(seconds=timeout_s)
    )
    try:
        result = fn(payload, rank, world, local_rank)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
        return gathered if rank == 0 else None
    finally:
        dist.destroy_process_group()
