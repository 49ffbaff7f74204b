"""One process per rank: spawn local ranks, or join the ranks torchrun started.

Under torchrun (its RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT protocol) this
process is one rank and rank 0 collects every rank's result; otherwise `world_size` local
processes are spawned and the parent collects. A failing rank's traceback is raised in the
caller, and its peers are stopped instead of waiting out the collective timeout.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

log = logging.getLogger("hicache-pipeline")

RankFn = Callable[[Any, int, int, int], Any]
"""(payload, rank, world_size, local_rank) -> a picklable result."""

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
GRACE_S = 3.0
"""How long peers of a failed rank get to report before they are terminated."""


class RankFailure(RuntimeError):
    """A rank raised; the message holds its traceback."""


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


def init_backend(backend: str) -> str:
    """Process-group backend string: nccl for cuda tensors plus gloo for CPU ones."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


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
    return _spawn(fn, payload, world_size, backend, timeout_s, job_s or timeout_s + 30)


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_entry(
    fn: RankFn,
    payload: Any,
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    results: Any,
) -> None:
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            init_backend(backend),
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        results.put((rank, True, fn(payload, rank, world_size, rank)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(
    fn: RankFn, payload: Any, world_size: int, backend: str, timeout_s: float, job_s: float
) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_entry,
            name=f"rank-{rank}",
            args=(fn, payload, rank, world_size, port, backend, timeout_s, results),
        )
        for rank in range(world_size)
    ]
    log.info("starting %d ranks", world_size)
    for p in procs:
        p.start()
    done: dict[int, Any] = {}
    failed: dict[int, str] = {}
    try:
        _collect(procs, results, job_s, done, failed)
    finally:
        for p in procs:
            if failed or (p.exitcode is None and len(done) < world_size):
                p.terminate()
            p.join()
    if failed:  # the first to report is usually the cause; its peers failed because of it
        rank = next(iter(failed))
        also = sorted(set(failed) - {rank})
        raise RankFailure(
            f"rank {rank} failed{f' (then ranks {also})' if also else ''}:\n{failed[rank]}"
        )
    return [done[r] for r in range(world_size)]


def _collect(
    procs: list[Any], results: Any, job_s: float, done: dict[int, Any], failed: dict[int, str]
) -> None:
    """Fill `done` and `failed` as ranks report, until all have, a failed rank's peers had
    `GRACE_S` to report, or `job_s` ran out (RankFailure)."""
    world_size = len(procs)
    failed_at = 0.0
    deadline = time.monotonic() + job_s
    while len(done) + len(failed) < world_size:
        if failed and time.monotonic() > failed_at + GRACE_S:
            return
        if time.monotonic() > deadline:
            raise RankFailure(
                f"ranks {sorted(set(range(world_size)) - set(done))} "
                f"reported nothing within {job_s:.0f} s"
            )
        try:
            rank, ok, value = results.get(timeout=0.5)
        except queue.Empty:
            for r, p in enumerate(procs):
                if r not in done and r not in failed and p.exitcode not in (None, 0):
                    failed[r] = f"process exited with code {p.exitcode} before reporting"
                    failed_at = time.monotonic()
            continue
        if ok:
            done[rank] = value
        else:
            failed[rank] = value
            failed_at = time.monotonic()
