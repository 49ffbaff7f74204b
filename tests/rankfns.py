"""Functions that run inside spawned ranks (one process per rank, real gloo groups)."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
from typing import Any

import torch

from pipeline.config.job import Job
from pipeline.core.slots import page_tokens
from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.engine.transfer.state import Transfer
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot
from pipeline.jobs.run import drive, forward, run_report
from stages.scatter import Scatter


def run_jobs(jobs: list[Job], rank: int, world_size: int, local_rank: int) -> list:
    """`run` on this rank for each job in turn, with its op trace (one spawn serves many)."""
    return [run_report(job, rank, world_size, local_rank, trace=True) for job in jobs]


def fail_on_rank_1(payload: None, rank: int, world_size: int, local_rank: int) -> int:
    """Rank 1 raises; rank 0 waits in a collective for it, as a real job would."""
    if rank == 1:
        raise ValueError("rank 1 gives up")
    torch.distributed.barrier()
    return rank


def with_load_stages(engine: Engine, **lists: tuple) -> None:
    """Replace some of the engine's load stage lists (test stages, or one left out)."""
    strategy = engine.strategy
    load = dataclasses.replace(strategy.load, **lists)
    engine.strategy = dataclasses.replace(strategy, load=load)


def _backed_up(engine: Engine, num_pages: int) -> tuple[list[int], list[int], dict]:
    """Fill source pages, back them up; returns (host pages, source pages, expected bytes)."""
    source = list(range(num_pages))
    fill_random(engine, source, 7)
    expected = snapshot(engine, source)
    host = engine.host_allocator.claim(list(range(num_pages)))
    size = engine.sizing.slots_per_page
    engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
    return host, source, expected


def _load_and_check(engine: Engine, host: list[int], target: list[int], expected: dict) -> str:
    """Load into poisoned target pages; '' when bit-exact, else the failure message."""
    size = engine.sizing.slots_per_page
    poison(engine, target)
    handle = engine.load(page_tokens(host, size), page_tokens(target, size))
    try:
        forward(engine, handle)
        handle.done(engine.runtime.forward_stream).wait()
    except (RuntimeError, TimeoutError) as e:
        return str(e)
    return first_mismatch(engine, target, expected)


def negative_control(args: tuple[Job, str], rank: int, world_size: int, local_rank: int) -> str:
    """Break one rank on purpose; returns what verification said on this rank.

    skip_scatter: rank 1 takes part in every broadcast but drops what it receives (the load
    targets every other page: consecutive pages would be broadcast in place, with no scatter).
    diverge_host: after the backup, one byte of host page 0 of layer 0 flips on the rank
    that holds it (rank 1 when replicated, the layer's owner otherwise).
    """
    job, case = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        if case == "skip_scatter" and rank == 1:
            kept = tuple(s for s in engine.strategy.load.exchange if not isinstance(s, Scatter))
            with_load_stages(engine, exchange=kept)
        host, source, expected = _backed_up(engine, 4)
        unit = engine.model.units[0]
        holder = engine.owners.sources[0]
        if case == "diverge_host" and rank == (1 if holder is None else holder):
            engine.host_pool.layer(unit).view(torch.uint8)[host[0], 0, 0] ^= 0xFF
        return _load_and_check(engine, host, [2 * p + 8 for p in source], expected)
    finally:
        engine.close()


def overlap(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """Can the forward use layer 0 while the last layer has not arrived yet?

    A stage held on an event stalls the transfer stream before the last layer's copy (gate
    ordering), or the forward simply has not asked for later layers (forward_stream).
    """
    engine = open_engine(job.recipe(), local_rank)
    release = threading.Event()
    last = engine.model.num_layers - 1
    hold = HoldBefore(layer=last, release=release)
    with_load_stages(engine, per_step=(hold, *engine.strategy.load.per_step))
    try:
        host, source, expected = _backed_up(engine, 4)
        target = [p + 8 for p in source]
        size = engine.sizing.slots_per_page
        handle = engine.load(page_tokens(host, size), page_tokens(target, size))
        forward_stream = engine.runtime.forward_stream
        if engine.strategy.config.ordering.value == "forward_stream":
            release.set()  # nothing is held: later layers wait for the forward to ask
        handle.wait(0, forward_stream)
        result = {"layer0_ready": handle.ready(0), "last_ready_early": handle.ready(last)}
        release.set()
        for layer in range(1, last + 1):
            handle.wait(layer, forward_stream)
        handle.done(forward_stream).wait()
        result["mismatch"] = first_mismatch(engine, target, expected)
        return result
    finally:
        release.set()
        engine.close()


class HoldBefore:
    """Test stage: blocks its stream at the first step of `layer` until released."""

    def __init__(self, *, layer: int, release: threading.Event) -> None:
        self.layer, self.release = layer, release

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        if step.unit.layer == self.layer:
            assert self.release.wait(timeout=30), "never released"


def bad_input(job: Job, rank: int, world_size: int, local_rank: int) -> list[str]:
    """Each malformed transfer raises ValueError and leaves both pools byte-for-byte alone."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        host, source, _ = _backed_up(engine, 4)
        device_before = {k: v.clone() for k, v in engine.device_pool.buffers.items()}
        host_before = [b.clone() for b in engine.host_pool.storage]
        size = engine.sizing.slots_per_page
        good_host, good_device = page_tokens(host, size), page_tokens(source, size)
        cases = {
            "ragged": (good_host[:-1], good_device[:-1]),
            "out of range": (good_host + 10**6, good_device),
            "mismatched": (good_host, good_device[:size]),
            "duplicates": (page_tokens([0, 0], size), page_tokens([1, 2], size)),
        }
        said = []
        for hosts, devices in cases.values():
            for call in (engine.backup, engine.load):
                try:
                    call(hosts, devices)
                except ValueError as e:
                    said.append(str(e))
        for call in (engine.load, engine.backup):  # host pages 9 and 10: never allocated
            try:
                call(page_tokens([9, 10], size), page_tokens([1, 2], size))
            except ValueError as e:
                said.append(str(e))
        engine.runtime.load_stream.synchronize()
        engine.runtime.write_stream.synchronize()

        def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bytes: random bf16 holds NaNs
            return torch.equal(a.view(torch.uint8), b.view(torch.uint8))

        unchanged = all(same(device_before[k], v) for k, v in engine.device_pool.buffers.items())
        unchanged &= all(
            same(a, b) for a, b in zip(host_before, engine.host_pool.storage, strict=True)
        )
        return [*said, f"unchanged={unchanged}"]
    finally:
        engine.close()


def no_sync_on_issue(job: Job, rank: int, world_size: int, local_rank: int) -> str:
    """cuda: issue a backup and a load-back with device->host syncs turned into errors."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        source = list(range(8))
        fill_random(engine, source, 3)
        expected = snapshot(engine, source)
        target = [p + 8 for p in source]
        poison(engine, target)
        engine.host_allocator.claim(source)  # the host pages, as the device's
        size = engine.sizing.slots_per_page
        hosts, sources, targets = (page_tokens(p, size) for p in (source, source, target))
        forward_stream = engine.runtime.forward_stream
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            ack = engine.backup(hosts, sources)
            forward_stream.wait_event(ack)
            handle = engine.load(hosts, targets)
            engine.begin_forward(forward_stream)
            for layer in range(handle.num_layers):
                handle.wait(layer, forward_stream)
            done = handle.done(forward_stream)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        done.wait()
        return first_mismatch(engine, target, expected)
    finally:
        engine.close()


class SleepBefore:
    """Test stage: puts a long GPU sleep on the stream before `layer`'s copy (before its
    group's, where a load groups layers)."""

    def __init__(self, *, layer: int) -> None:
        self.layer = layer

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        if self.layer in step.layers and step.first == 0:
            torch.cuda._sleep(2_000_000_000)  # ~1 s at H200 clocks


def overlap_cuda(job: Job, rank: int, world_size: int, local_rank: int) -> dict[str, Any]:
    """cuda: layer 0 is usable while the last layer is still held up on the load stream."""
    engine = open_engine(job.recipe(), local_rank)
    last = engine.model.num_layers - 1
    load = engine.strategy.load
    try:
        host, source, expected = _backed_up(engine, 4)
        target = [p + 8 for p in source]
        size = engine.sizing.slots_per_page
        forward_stream = engine.runtime.forward_stream
        # a first load creates the NCCL communicators (the host blocks meanwhile): untimed
        engine.load(page_tokens(host, size), page_tokens(target, size)).done(forward_stream).wait()
        with_load_stages(engine, per_step=(SleepBefore(layer=last), *load.per_step))
        handle = engine.load(page_tokens(host, size), page_tokens(target, size))
        handle.wait(0, forward_stream)
        handle.transfer.layer_events[0].wait()
        result = {"layer0_ready": handle.ready(0), "last_ready_early": handle.ready(last)}
        handle.done(forward_stream).wait()
        result["mismatch"] = first_mismatch(engine, target, expected)
        return result
    finally:
        engine.close()


def diverged_state(args: tuple[Job, int], rank: int, world_size: int, local_rank: int) -> str:
    """Idle skips, then the forced sync: rank 1's host allocator differs (a bug to catch)."""
    job, max_skips = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        if rank == 1:
            engine.host_allocator.alloc(1)
        for _ in range(max_skips + 1):
            try:
                engine.poll()
            except RuntimeError as e:
                return str(e)
        return ""
    finally:
        engine.close()


def graph_replays(
    args: tuple[Job, list[int]], rank: int, world_size: int, local_rank: int
) -> dict[str, Any]:
    """cuda: one backup and load per round, of `counts[round]` pages, on other random pages each
    round; every round bit-exact. Returns the captures and whether every round logged the same
    ops (only meaningful for equal counts)."""
    job, counts = args
    engine = open_engine(job.recipe(), local_rank, keep_trace=True)
    try:
        assert engine.graphs is not None, "graphs apply to this config"
        size, pages = engine.sizing.slots_per_page, engine.sizing.device_pages
        forward_stream = engine.runtime.forward_stream
        pick = random.Random(5)  # the same draws on every rank
        mismatches, ops = [], []
        for round_, count in enumerate(counts):
            source = pick.sample(range(pages // 2), count)
            target = pick.sample(range(pages // 2, pages), count)
            host = engine.host_allocator.alloc(count, pick)
            fill_random(engine, source, round_)
            expected = snapshot(engine, source)
            poison(engine, target)
            first_op = len(engine.trace.ops)
            ack = engine.backup(page_tokens(host, size), page_tokens(source, size))
            forward_stream.wait_event(ack)
            handle = engine.load(page_tokens(host, size), page_tokens(target, size))
            engine.begin_forward(forward_stream)
            handle.done(forward_stream).wait()
            mismatches.append(first_mismatch(engine, target, expected))
            ops.append(engine.trace.ops[first_op:])
            engine.host_allocator.free(host)
        return {
            "mismatches": mismatches,
            "captures": engine.graphs.captures,
            "kept": len(engine.graphs),
            "same_ops": all(o == ops[0] for o in ops),
            "ops": len(ops[0]),
        }
    finally:
        engine.close()


class Fault:
    """Test stage: on rank `rank`, at the first step of `layer`, raise, or send this process a
    signal (SIGKILL: killed mid-transfer; SIGSTOP: stopped, so its heartbeat stops)."""

    def __init__(self, *, rank: int, layer: int = 1, signal_name: str | None = None) -> None:
        self.rank, self.layer, self.signal_name = rank, layer, signal_name

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        if t.plan.spec.rank != self.rank or step.unit.layer != self.layer or step.first:
            return
        if self.signal_name is None:
            raise RuntimeError(f"injected fault on rank {self.rank}")
        os.kill(os.getpid(), getattr(signal, self.signal_name))


def failed_then_next(args: tuple[Job, str], rank: int, world_size: int, local_rank: int) -> dict:
    """A transfer whose `where` ('backup' or 'load') pipeline raises on rank 0, then a clean
    backup and load: what the failed call said, and what the next round trip said ('' when
    bit-exact)."""
    job, where = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        pages = list(range(4))
        fill_random(engine, pages, 11)
        expected = snapshot(engine, pages)
        engine.host_allocator.claim([p + 20 for p in pages])  # what `_round_trip` backs up into
        clean = engine.strategy
        faulty = clean.backup if where == "backup" else clean.load
        faulty = dataclasses.replace(faulty, per_step=(Fault(rank=0, layer=0), *faulty.per_step))
        said: dict[str, Any] = {}
        if where == "load":
            _round_trip(engine, pages)  # a clean backup to load from
        engine.strategy = dataclasses.replace(clean, **{where: faulty})
        try:
            if where == "backup":
                _round_trip(engine, pages)
                said["first"] = "ok"
            else:
                host, target = [p + 20 for p in pages], [p + 8 for p in pages]
                said["first"] = _load_and_check(engine, host, target, expected) or "ok"
        except (RuntimeError, TimeoutError) as e:
            said["first"] = str(e)
        engine.strategy = clean
        try:
            said["second"] = _load_and_check(engine, *_round_trip(engine, pages), expected)
        except RuntimeError as e:
            said["second"] = str(e)
        return said
    finally:
        engine.close()


def _round_trip(engine: Engine, pages: list[int]) -> tuple[list[int], list[int]]:
    """Back up `pages` into host pages 20.. ; (host pages, target pages) for a load."""
    size = engine.sizing.slots_per_page
    host = [p + 20 for p in pages]
    engine.backup(page_tokens(host, size), page_tokens(pages, size)).wait()
    return host, [p + 8 for p in pages]


def faulty_run(args: tuple[Job, int, str], rank: int, world_size: int, local_rank: int) -> dict:
    """`run` cycles with a stage that sends `signal_name` to rank `victim` mid-load."""
    job, victim, signal_name = args
    engine = open_engine(job.recipe(), local_rank)
    load = engine.strategy.load
    fault = Fault(rank=victim, layer=1, signal_name=signal_name)
    with_load_stages(engine, per_step=(fault, *load.per_step))
    try:
        return drive(engine, job.workload)
    finally:
        engine.close()


def after_close(job: Job, rank: int, world_size: int, local_rank: int) -> list[str]:
    """What each engine call says once the engine is closed."""
    engine = open_engine(job.recipe(), local_rank)
    engine.close()
    engine.close()  # a second close is fine
    slots = page_tokens([0], engine.sizing.slots_per_page)
    said = []
    for call in (
        lambda: engine.backup(slots, slots),
        lambda: engine.load(slots, slots),
        engine.poll,
        lambda: engine.begin_forward(engine.runtime.forward_stream),
    ):
        try:
            call()
        except RuntimeError as e:
            said.append(str(e))
    return said


def engines_made_and_closed(
    args: tuple[Job, int], rank: int, world_size: int, local_rank: int
) -> list:
    """Open and close `count` engines (each backs up and loads one page): (open fds, OS
    threads) after 10 and after all of them."""
    job, count = args
    seen = []
    for i in range(count):
        engine = open_engine(job.recipe(), local_rank)
        size = engine.sizing.slots_per_page
        fill_random(engine, [0], i)
        host = engine.host_allocator.alloc(1)
        engine.backup(page_tokens(host, size), page_tokens([0], size)).wait()
        engine.load(page_tokens(host, size), page_tokens([1], size)).done().wait()
        while engine.acks.pending:
            engine.poll()
        engine.close()
        if i + 1 in (10, count):
            seen.append((len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))))
    return seen


def adopted_round_trips(
    cases: list[tuple[Job, bool]], rank: int, world_size: int, local_rank: int
) -> list[str]:
    """Per (job, stacked): the public API's engine on adopted KV (one tensor per layer, or
    views of one buffer), random bytes backed up, zeroed, loaded back: '' when bit-exact,
    else the first key that differs."""
    import pipeline

    found = []
    for job, stacked in cases:
        units = job.model.units  # an MLA model: kv units of bf16 rows
        shape = (8, units[0].rows_per_page, units[0].row_bytes // 2)
        whole = torch.zeros(len(units), *shape, dtype=torch.bfloat16)
        tensors = {
            (u.pool, u.layer): whole[i] if stacked else whole[i].clone()
            for i, u in enumerate(units)
        }
        gen = torch.Generator().manual_seed(17)  # the same bytes on every rank (MLA: replicas)
        for t in tensors.values():
            t.copy_(torch.randn(t.shape, generator=gen))
        before = {k: t.clone() for k, t in tensors.items()}
        engine = pipeline.create_engine(job, device_kv=tensors)
        try:
            slots = torch.arange(0, 7 * job.model.page_size)  # a partial last batch
            engine.host_allocator.claim(list(range(7)))
            engine.backup(slots, slots).wait()
            for t in tensors.values():
                t.zero_()
            engine.load(slots, slots).done().wait()
            engine.poll()
            bad = [k for k, t in tensors.items() if not torch.equal(t[:7], before[k][:7])]
            found.append(str(bad[0]) if bad else "")
        finally:
            engine.close()
    return found
