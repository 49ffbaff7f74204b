"""Local ranks, one process each, watched until every one has reported or one has failed.

Ranks are forked by a forkserver (one per launching process, which imports torch and this
module once). Every rank dies with the parent (a parent-death signal on the forkserver, which
ends with the parent, and a heartbeat thread that watches the parent), beats a heartbeat into
shared memory, and reports its result or its traceback on a queue (a config mistake that
only a rank could find, such as a busy port, as the ConfigError the parent then raises).
The parent notices a rank that exits without a report (its exit code or signal) and one
whose heartbeat stops (a stopped or hung process), gives the others a short grace to
report, then stops them all (SIGTERM, then SIGKILL), and names the rank that failed first
and how. A rank that died or stalled is blamed before peers that only reported the broken
collective it left behind.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import re
import shutil
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.core.checks import ConfigError, Problem
from pipeline.jobs import rank_start
from pipeline.jobs.scratch import made_folder

log = logging.getLogger("hicache-pipeline")

RankFn = Callable[[Any, int, int, int], Any]
"""(payload, rank, world_size, local_rank) -> a picklable result."""
GRACE_S = 3.0
"""How long the peers of a failed rank get to report before they are stopped."""
STOP_GRACE_S = 2.0
"""How long a rank gets to end after SIGTERM before SIGKILL."""


class RankFailure(RuntimeError):
    """A rank failed; the message names it, says how, and holds its traceback."""


def init_backend(backend: str) -> str:
    """Process-group backend string: nccl for cuda tensors plus gloo for CPU ones."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_entry(
    fn: RankFn,
    payload: Any,
    rank: int,
    world_size: int,
    rendezvous: str,
    backend: str,
    timeout_s: float,
    results: Any,
) -> None:
    """One spawned rank, once `rank_start.start` armed its death and heartbeat: run `fn`,
    report."""
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            init_backend(backend),
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        results.put((rank, True, fn(payload, rank, world_size, rank)))
    except ConfigError as e:  # a config mistake only the rank could see (a busy port)
        results.put((rank, False, e.problems))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass
class Watch:
    """What the parent has seen of its ranks so far."""

    procs: list[Any]
    beats: Any
    stall_s: float
    """A rank with no heartbeat for this long is stalled (runtime.timeout_s)."""
    done: dict[int, Any] = field(default_factory=dict)
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)
    """rank -> (kind, how) in the order seen: kind 'died', 'stalled' or 'raised'."""
    first_failure: float | None = None
    refused: list[Problem] = field(default_factory=list)
    """The config mistakes the first rank that found one reported (the job's cause)."""

    def report(self, rank: int, ok: bool, value: Any) -> None:
        if ok:
            self.done[rank] = value
        elif isinstance(value, list):
            self.refused = self.refused or value
            self.fail(rank, "raised", "; ".join(str(p) for p in value))
        else:
            self.fail(rank, "raised", value)

    def fail(self, rank: int, kind: str, how: str) -> None:
        if rank not in self.failed:
            self.failed[rank] = (kind, how)
            self.first_failure = self.first_failure or time.monotonic()

    def look(self) -> None:
        """Note each rank that ended without a report, or whose heartbeat stopped."""
        now = time.monotonic()
        for rank, proc in enumerate(self.procs):
            if rank in self.done or rank in self.failed:
                continue
            if proc.exitcode not in (None, 0):
                self.fail(rank, "died", _how_it_ended(proc.exitcode))
            elif self.beats[rank] and now - self.beats[rank] > self.stall_s:
                age = now - self.beats[rank]
                self.fail(rank, "stalled", f"sent no heartbeat for {age:.0f} s (stopped or hung)")


def _how_it_ended(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name} before reporting"
    return f"exited with code {code} before reporting"


def spawn(
    fn: RankFn, payload: Any, world_size: int, backend: str, timeout_s: float, job_s: float
) -> list[Any]:
    """`fn` on `world_size` local ranks; every result in rank order, or RankFailure."""
    # forked by the forkserver, which imports torch and the rank's code once per process: a
    # spawned rank imported them itself, seconds of CPU per rank on a busy machine
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    results, beats = ctx.Queue(), ctx.Array("d", world_size, lock=False)
    # the ranks meet through a file, not a port another job could take between pick and bind
    folder, parent = made_folder("hicache-ranks-"), os.getpid()
    rendezvous = os.path.join(folder, "rendezvous")
    work = [
        pickle.dumps((rank_entry, (fn, payload, rank, world_size, rendezvous, backend, timeout_s)))
        for rank in range(world_size)
    ]
    procs = [
        ctx.Process(
            target=rank_start.start,
            name=f"rank-{rank}",
            args=(work[rank], rank, parent, beats, results),
        )
        for rank in range(world_size)
    ]
    for rank, p in enumerate(procs):
        beats[rank] = time.monotonic()  # a rank stopped before its first beat is seen too
        p.start()
    log.info("starting %d ranks (pids %s)", world_size, [p.pid for p in procs])
    watch = Watch(procs, beats, stall_s=timeout_s)
    try:
        _supervise(watch, results, job_s, timeout_s)
    finally:
        _stop(procs, set(watch.done))
        shutil.rmtree(folder, ignore_errors=True)
    if watch.refused:  # a config mistake, said in one line as the parent's own are
        raise ConfigError(watch.refused)
    if watch.failed:
        raise RankFailure(_blame(watch, timeout_s))
    return [watch.done[r] for r in range(world_size)]


def _supervise(watch: Watch, results: Any, job_s: float, timeout_s: float) -> None:
    """Collect reports until all are in, a failed rank's peers had their grace, or `job_s`
    ran out (RankFailure naming the ranks that never reported)."""
    deadline = time.monotonic() + job_s
    while len(watch.done) + len(watch.failed) < len(watch.procs):
        now = time.monotonic()
        if watch.first_failure is not None and now > watch.first_failure + GRACE_S:
            return
        if now > deadline:
            silent = sorted(set(range(len(watch.procs))) - set(watch.done))
            raise RankFailure(
                f"ranks {silent} reported nothing within {job_s:.0f} s: raise "
                f"runtime.timeout_s (now {timeout_s:g} s) if they were only slow"
            )
        try:
            watch.report(*results.get(timeout=0.25))
        except queue.Empty:
            watch.look()


def _stop(procs: list[Any], reported: set[int]) -> None:
    """End every rank still running: the ranks that reported get a grace to exit on their own
    (a SIGTERM while they clean up leaves their semaphores to the resource tracker's
    warning), then SIGTERM, then SIGKILL after a grace (a stopped process ignores SIGTERM
    until continued; SIGKILL ends it anyway)."""
    deadline = time.monotonic() + STOP_GRACE_S
    for rank in reported:
        procs[rank].join(max(0.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.exitcode is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.exitcode is None:
            p.kill()
        p.join()


def _blame(watch: Watch, timeout_s: float) -> str:
    """The rank that failed first and how: one that died or stalled before one that raised
    (whose error is usually the broken collective the first left behind)."""
    order = list(watch.failed)
    causes = [r for r in order if watch.failed[r][0] != "raised"] or order
    first = causes[0]
    kind, how = watch.failed[first]
    others = [r for r in order if r != first]
    head = f"rank {first} failed" if kind == "raised" else f"rank {first} {how}"
    lines = [head + (f" (then ranks {sorted(others)})" if others else "") + ":"]
    raised = [r for r in order if watch.failed[r][0] == "raised"]
    if kind == "raised":
        lines.append(how)
    elif raised:
        lines.append(f"rank {raised[0]} reported:\n{watch.failed[raised[0]][1]}")
    text = "\n".join(lines)
    if kind == "stalled" or re.search(r"time[d ]?out", text, re.IGNORECASE):
        text += f"\n(runtime.timeout_s={timeout_s:g}: raise it if the ranks were only slow)"
    return text
