"""Where a write-back to a file store spends its time: Python before the native call, the
call itself (`_fileio.write_objects`), and the engine's write-back around it.

N page objects of deepseek_v3 (as `probe_reads.py` makes them) removed and written back
again and again with `write_pages`, the tier's batched write of a write-back, then as many
times through `Engine.write_back` (its ack waited for, as `bench=l3` times it); it prints
the median and the slowest of each over the writes after the first two. From the root, on a
cuda or a CPU machine:
    python benchmarks/write_phases.py --pages 256 --threads 4 16
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from typing import Any

import torch.distributed as dist
from probe_reads import Probe, probe_args

from pipeline.core.slots import page_tokens
from pipeline.engine.l3.stores import file_writes
from pipeline.engine.l3.writes import write_pages


def timed_writes(p: Probe, writes: int) -> dict[str, list[float]]:
    """Each write's whole time and its native call's, in ms."""
    native: list[float] = []
    original = file_writes.write_objects

    @functools.wraps(original)
    def call(*args: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args)
        finally:
            native.append((time.perf_counter() - began) * 1e3)

    engine, size = p.engine, p.engine.sizing.slots_per_page
    hosted = page_tokens(p.host, size)
    engine.backup(hosted, page_tokens(range(len(p.keys)), size)).wait()  # slots holding data
    tier, found = p.tier, {"write": [], "native": [], "engine": []}
    names = [tier.name(k) for k in p.keys]
    pages = [int(page) for page in p.host]
    file_writes.write_objects = call
    try:
        for _ in range(writes):  # in turn, so neither always finds the page cache as left
            tier.store.remove(names)
            native.clear()
            began = time.perf_counter()
            write_pages(tier, p.keys, pages, [{}] * len(pages))
            found["write"].append((time.perf_counter() - began) * 1e3)
            found["native"].append(sum(native))
            tier.store.remove(names)
            began = time.perf_counter()
            engine.write_back(p.keys, hosted).wait()
            while engine.acks.pending:
                engine.poll()
            found["engine"].append((time.perf_counter() - began) * 1e3)
    finally:
        file_writes.write_objects = original
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=256)
    parser.add_argument("--threads", type=int, nargs="+", default=[4])
    parser.add_argument("--writes", type=int, default=10)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides")
    parser.add_argument("--json", default=None, help="write the times here")
    args = parser.parse_args()
    arguments = probe_args(args.pages, args.override)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    found: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="write-phases-") as folder:
        for threads in args.threads:
            probe = Probe(arguments, threads, folder, {})
            try:
                found[str(threads)] = times = timed_writes(probe, args.writes)
            finally:
                probe.engine.close()
            write, native = times["write"][2:], times["native"][2:]  # the first two warm up
            python = [w - n for w, n in zip(write, native, strict=True)]
            engine = times["engine"][2:]
            print(f"io_threads={threads}, ms over {len(write)} writes: median / slowest")
            for name, values in (
                ("write", write),
                ("native call", native),
                ("python", python),
                ("engine write-back", engine),
            ):
                print(f"  {name}: {statistics.median(values):.1f} / {max(values):.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
