"""Resource guards: a job this machine cannot hold is refused before any rank starts.

Local ranks beyond the machine (more than its GPUs, or many more than its cores), and pools
larger than its free memory, each name the key to change. Under torchrun every process is one
rank that torchrun placed, so only the memory of this process's own rank is weighed.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from pipeline.config.job import Job
from pipeline.core.checks import Problem
from pipeline.core.sizing import device_staging_bytes, size_rank
from pipeline.engine.runtime import pick_device
from pipeline.jobs.launch import under_torchrun
from pipeline.jobs.report import human_bytes

RANKS_PER_CORE = 8
"""Local CPU ranks allowed per core (each is a process running gloo and worker threads)."""


def available_memory() -> int:
    """Bytes of memory the machine can still give (MemAvailable; free pages elsewhere)."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def host_bytes(job: Job, rank: int) -> int:
    """Host memory one rank's engine allocates: its host pool, and on CPU its device pool and
    staging buffers too."""
    model, topology, config = job.model, job.topology, job.strategy.config
    sizing = size_rank(model, topology, config, rank, job.budget())
    owners = sizing.owners
    total = sizing.host.pool_bytes
    if pick_device(topology.device, 0).type == "cpu":
        total += sizing.device_pages * sum(u.page_bytes for u in model.units)
        total += device_staging_bytes(config, topology, model, owners, rank)
    return total


def resource_problems(job: Job) -> list[Problem]:
    """What this machine cannot hold of the job's local ranks and their pools."""
    if not under_torchrun() and (found := _rank_problems(job)):
        return found  # sizing the pools of ranks that cannot start would only take time
    ranks = [int(os.environ["RANK"])] if under_torchrun() else range(job.topology.tp_size)
    need = sum(host_bytes(job, r) for r in ranks)
    free = available_memory()
    if need <= free:
        return []
    return [
        Problem(
            "workload.device_tokens",
            f"the pools of {len(ranks)} local ranks need {human_bytes(need)} of host memory "
            f"and {human_bytes(free)} is free: lower workload.device_tokens or "
            f"{job.workload.host_key}",
        )
    ]


def _rank_problems(job: Job) -> list[Problem]:
    ranks = job.topology.tp_size
    if pick_device(job.topology.device, 0).type == "cuda":
        gpus = torch.cuda.device_count()
        if ranks > gpus:
            return [
                Problem(
                    "topology.tp_size",
                    f"topology.tp_size={ranks} needs {ranks} GPUs on this machine and "
                    f"{gpus} are here: lower it, launch with torchrun across nodes, or run "
                    "on CPU ranks (topology.device=cpu)",
                )
            ]
        return []
    cores = os.cpu_count() or 1
    if ranks > RANKS_PER_CORE * cores:
        return [
            Problem(
                "topology.tp_size",
                f"topology.tp_size={ranks} local ranks on {cores} cores: at most "
                f"{RANKS_PER_CORE * cores} here; lower it, or launch with torchrun across nodes",
            )
        ]
    return []
