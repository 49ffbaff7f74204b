"""Where a transfer's issue time goes: cProfile of `backup()` / `load()` + `done()` per path.

Run on a cuda machine from the repository root (one GPU, tp1):

    python3 benchmarks/profile_issue.py --tokens 16384 --out profile.txt

For each path (direct / kernel, graphed or not, chunked or not, contiguous or fragmented
pages) it prints the median issue time of many calls, then the functions that took the most
of it under cProfile (own time), so a change can aim at the largest share first. cProfile
overstates numpy and ctypes calls on some hosts, so each path's median is also split without
the profiler: the plan (`Engine.transfer`), each stage list's own time (the engine's
`timings_s`) and the rest (the API around them); and into the pieces named in `PIECES`
(inclusive, each wrapped in a timer while it is measured), so the issue-time tables of
docs/benchmarks/history/ (session 22) come from this script. Each repetition follows a
synchronize, as a scheduler's issue follows other work: see BENCHMARKS.md for what that
costs each distinct call.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import pstats
import random
import statistics
import time
from unittest import mock

import torch
import torch.distributed as dist

import pipeline
import pipeline.core.plan as plan_module
import pipeline.engine.engine as engine_module
import pipeline.engine.transfer.executor as executor
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.core.steps import StepLayout
from pipeline.engine.acks import AckLedger
from pipeline.engine.cuda.memcpy_batch import Batches
from pipeline.engine.cuda.page_ids import PageIdBuffers
from pipeline.engine.transfer.graphs import TransferGraphs

PATHS = [  # (io backend, host layout, chunk pages, graph cache, placement)
    ("direct", "page_first_direct", 0, 0, "contiguous"),
    ("direct", "page_first_direct", 16, 0, "contiguous"),
    ("kernel", "layer_first", 0, 0, "contiguous"),
    ("kernel", "layer_first", 0, 0, "fragmented"),
    ("kernel", "layer_first", 16, 0, "fragmented"),
    ("kernel", "layer_first", 0, 8, "contiguous"),
]


def engine_for(
    io: str, layout: str, chunk: int, graphs: int, tokens: int, device: str, extra: list[str]
) -> pipeline.Engine:
    job = pipeline.compose(
        [
            "model=deepseek_v3",
            "topology=tp1",
            f"topology.device={device}",
            f"topology.io_backend={io}",
            f"topology.mem_layout={layout}",
            f"strategy.chunk_pages={chunk}",
            f"strategy.cuda_graph_cache={graphs}",
            f"workload.num_tokens={tokens}",
            f"workload.device_tokens={3 * tokens}",
            *extra,
        ]
    )
    return pipeline.create_engine(job)


def issue_fns(engine: pipeline.Engine, placement: str, tokens: int):
    size = engine.sizing.slots_per_page
    pages = tokens // size
    pick = None if placement == "contiguous" else random.Random(0)
    device = PageAllocator(engine.sizing.device_pages)
    source, target = device.alloc(pages, pick), device.alloc(pages, pick)
    host = engine.host_allocator.alloc(pages, pick)
    host_t, source_t, target_t = (page_tokens(p, size) for p in (host, source, target))
    forward = engine.runtime.forward_stream

    def backup() -> None:
        forward.wait_event(engine.backup(host_t, source_t))

    def load() -> None:
        handle = engine.load(host_t, target_t)
        engine.begin_forward(forward)
        forward.wait_event(handle.done(forward))

    return {"backup": backup, "load": load}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    sync()
    return statistics.median(times) * 1e3


def phases(engine: pipeline.Engine, fn, reps: int) -> str:
    """Median us per call of the plan, each stage list and the rest, timed without cProfile
    (the engine's `transfer` timed through a wrapper on this instance only)."""
    plan_s: list[float] = []
    timings = engine.resources.timings_s
    per: dict[str, list[float]] = {"plan": [], "rest": []}
    with mock.patch.object(engine, "transfer", timed(engine.transfer, plan_s)):
        for _ in range(reps):
            sync()
            before, planned = dict(timings), len(plan_s)
            start = time.perf_counter()
            fn()
            total = time.perf_counter() - start
            spent = {k: v - before.get(k, 0.0) for k, v in timings.items()}
            plan = sum(plan_s[planned:])
            for name, seconds in spent.items():
                if seconds:
                    per.setdefault(name, []).append(seconds)
            per["plan"].append(plan)
            per["rest"].append(total - plan - sum(spent.values()))
        sync()
    return medians(per)


def timed(piece, into: list[float]):
    """`piece`, appending the seconds of each call to `into`."""

    @functools.wraps(piece)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return piece(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    return wrapper


def medians(per: dict[str, list[float]]) -> str:
    return ", ".join(f"{k} {statistics.median(v) * 1e6:.0f}" for k, v in per.items())


PIECES = [  # (where it is looked up when called, its name): the issue path's parts
    (plan_module, "page_rows"),  # both sides' slots checked, their pages
    (engine_module, "build_plan"),  # page_rows and the steps' layout
    (PageAllocator, "require_data"),
    (PageAllocator, "hold_data"),
    (engine_module, "follow"),  # the transfer stream behind the forward stream
    (StepLayout, "layer_events"),
    (executor, "prepare"),  # the page-id upload, where a path needs the ids
    (executor, "issue_copies"),
    (Batches, "filled"),  # a batch copy's table (cuda: the copy calls of stacked layers)
    (PageIdBuffers, "lend"),  # a lent id buffer (cuda)
    (executor, "issue_exchanges"),
    (executor, "finish"),
    (TransferGraphs, "issue"),  # a graph replay, its ids refilled
    (AckLedger, "submit"),
]


def pieces(fn, reps: int) -> str:
    """Median inclusive us per call of each piece `fn` calls (timed through wrappers)."""
    spent: dict[str, list[float]] = {name: [] for _, name in PIECES}
    with contextlib.ExitStack() as patched:
        for owner, name in PIECES:
            wrapper = timed(getattr(owner, name), spent[name])
            patched.enter_context(mock.patch.object(owner, name, wrapper))
        for _ in range(reps):
            sync()
            fn()
        sync()
    return medians({name: times for name, times in spent.items() if times})


def profiled(fn, reps: int, top: int) -> str:
    profile = cProfile.Profile()
    for _ in range(reps):
        sync()
        profile.enable()
        fn()
        profile.disable()
    sync()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default="profile.txt")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", default=None, help="profile only the paths naming this word")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rows, report = [], []
    for tokens in args.tokens:
        for io_backend, layout, chunk, graphs, placement in PATHS:
            if args.only is not None and args.only not in (io_backend, layout, placement):
                continue
            engine = engine_for(
                io_backend, layout, chunk, graphs, tokens, args.device, args.overrides
            )
            for direction, fn in issue_fns(engine, placement, tokens).items():
                name = (
                    f"{tokens} {direction} {io_backend} {placement} chunk={chunk} graphs={graphs}"
                )
                measure(fn, 10)  # warm: plans, graphs, views made once per shape
                ms = measure(fn, args.reps)
                rows.append(f"{name}: {ms:.3f} ms ({phases(engine, fn, args.reps)} us)")
                rows.append(f"  pieces: {pieces(fn, args.reps)} us")
                report.append(f"==== {name}: median {ms:.3f} ms\n{profiled(fn, 20, args.top)}")
            engine.close()
    with open(args.out, "w") as out:
        out.write("\n".join(rows) + "\n\n" + "\n".join(report))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
