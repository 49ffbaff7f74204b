"""Where a load from L3 spends its time: each phase of `load_from_l3` on a timeline.

N page objects of deepseek_v3 in a file store (as `probe_reads.py` makes them), loaded into
free host pages and the device tier again and again; for the last loads it prints, from the
load's start: the lookup, the fetch (the first group's reads and the agreement on the hits,
`load_from_l3`'s return), each native read call's start and end on its I/O thread, and the
load's end (its `done` event waited for). From the root, on a cuda or a CPU machine:
    python benchmarks/load_phases.py --pages 256 --threads 4 16 --override topology.device=cuda
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from probe_reads import Probe, probe_args

from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.l3 import batch, fetch
from pipeline.engine.l3.batch import FetchCall
from pipeline.engine.l3.group_reads import GroupReads
from pipeline.engine.l3.load import GroupedLoad, StreamedLoad
from pipeline.engine.l3.stores.file_parts import FileParts
from pipeline.engine.l3.stores.files import FileStore
from pipeline.engine.l3.tier import L3Tier
from stages import agree_on_hits


@contextlib.contextmanager
def timed(marks: list[tuple[str, float, float]]) -> Iterator[None]:
    """Record in `marks`, while inside, each native read call's (name, start, end), each
    check of a group it read (the fetch call's `on_group`, from the lock taken), the fetch
    (its reads' first group and the agreement on the hits: its settle and each round) and
    each group's copies issued."""
    originals: list[tuple[object, str, Callable[..., Any]]] = []

    def wrap(owner: object, name: str, label: Callable[..., str]) -> None:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        @functools.wraps(original)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                marks.append((label(*args), began, time.perf_counter()))

        setattr(owner, name, timed_call)

    wrap(FileParts, "read_units", lambda _, reads: f"read {len(reads.names)} objects")
    wrap(FetchCall, "on_group", lambda _, g: f"group {g} checked")
    wrap(L3Tier, "fetch", lambda *_: "fetch stages")
    wrap(agree_on_hits, "settle", lambda *_: "settled")
    wrap(L3Tier, "agree_while", lambda *_: "agreed")
    wrap(GroupedLoad, "issue", lambda _, steps: f"{len(steps)} steps issued")
    # the fetch's own parts: where the time before the first read and after the agreement goes
    wrap(L3Tier, "lookup", lambda *_: "lookup")
    wrap(fetch, "start_batches", lambda *_: "reads started")
    wrap(batch, "tier_reads", lambda *_: "first group planned")
    wrap(GroupReads, "__init__", lambda *_: "later groups planned")
    wrap(FileStore, "paths_below", lambda *_: "paths named")
    wrap(Engine, "transfer", lambda *_: "transfer planned")
    wrap(StreamedLoad, "__init__", lambda *_: "stream made")
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def one_load(p: Probe, marks: list[tuple[str, float, float]]) -> dict[str, Any]:
    """A load of every page: its phases' ends and read calls, in ms from its start."""
    e, n = p.engine, len(p.keys)
    size, fresh = e.sizing.slots_per_page, e.host_allocator.alloc(n)
    marks.clear()
    began = time.perf_counter()
    e.lookup(p.keys)
    looked = time.perf_counter()
    load = e.load_from_l3(p.keys, page_tokens(fresh, size), page_tokens(range(n, 2 * n), size))
    fetched = time.perf_counter()
    if load.handle is not None:
        load.handle.done(e.runtime.forward_stream).wait()
    ended = time.perf_counter()
    while e.acks.pending:
        e.poll()
    e.host_allocator.free(fresh)
    if load.hits != n:
        raise RuntimeError(f"load_from_l3: {load.hits} of {n} pages")

    def ms(t: float) -> float:
        return round((t - began) * 1e3, 2)

    return {
        "lookup": ms(looked),
        "fetch": ms(fetched),
        "end": ms(ended),
        "streamed": type(load.handle).__name__,
        "steps": [(name, ms(a), ms(b)) for name, a, b in marks],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[4])
    parser.add_argument("--loads", type=int, default=8)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides")
    parser.add_argument("--json", default=None, help="write the loads here")
    args = parser.parse_args()
    arguments = probe_args(args.pages, args.override)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    found: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="load-phases-") as folder:
        for threads in args.threads:
            probe, marks = Probe(arguments, threads, folder, {}), []
            try:
                with timed(marks):
                    loads = [one_load(probe, marks) for _ in range(args.loads)]
            finally:
                probe.engine.close()
            found[str(threads)] = loads
            warm = loads[2:]  # the first two warm up
            print(f"io_threads={threads}, {loads[-1]['streamed']}, median ms over", len(warm))
            for phase in ("lookup", "fetch", "end"):
                print(f"  {phase}: {statistics.median(x[phase] for x in warm):.1f}")
            print("  last load's steps:")
            for step in sorted(loads[-1]["steps"], key=lambda mark: mark[1]):
                print("   ", *step)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
