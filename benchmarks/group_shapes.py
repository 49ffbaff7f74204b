"""Which groups of layers a streamed load from L3 should read in: the ttft bench's prefix hit
under several cuts of the layers (`load.group_starts` replaced for the run), side by side.

Run on a cuda machine from the repository root (one GPU, tp1, a file store, defaults):

    python3 benchmarks/group_shapes.py --tokens 16384 --new 128 1024 8192 --out shapes.json

Per new-token count and cut, the bench's own regions in turn (`ttft_case`: the load alone,
the forward alone, load then forward, overlapped; each hit checked bit-exact, and a load
first checked to read in the cut's groups): median ms and
x ideal (overlapped over the larger of load and forward alone). The cuts, after the first
layer (alone: the forward's first layer waits for the fetch): `even`, `per_group` layers a
group (the default); `growing`, 1, 2, 3, ... layers up to `per_group` (a group arrives
while the layers before it compute); `growing, halving tail`, the same with the last group
cut in halves (less of the forward after the last read).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence

import torch.distributed as dist

import pipeline
from pipeline.engine.engine import Engine
from pipeline.engine.l3 import load
from pipeline.jobs.bench.forward import DEEPSEEK_V3
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.bench.ttft_case import Prefix, time_hit


def growing(num_layers: int, per_group: int) -> list[int]:
    starts, at, size = [], 1, 1
    while at < num_layers:
        starts.append(at)
        at, size = at + size, min(size + 1, per_group)
    return starts


def halving_tail(num_layers: int, per_group: int) -> list[int]:
    starts = growing(num_layers, per_group)
    if not starts:
        return starts
    at = starts.pop()  # the last group, cut in halves: 8 layers go as 4, 2, 1, 1
    while num_layers - at > 1:
        starts.append(at)
        at += -(-(num_layers - at) // 2)
    return [*starts, at]


def _check_cut(engine: Engine, prefix: Prefix, cut: Callable[[int, int], Sequence[int]]) -> None:
    """A load of the prefix streams in the groups `cut` makes (a group a read, the first
    layer's included), so each timed side runs the cut it names."""
    loading = prefix.load()
    assert isinstance(loading, load.StreamedLoad), "the load streams (on a GPU, or stream_layers)"
    tier, layers = engine.l3, engine.model.num_layers
    assert tier is not None
    per = load.streamed_layers(engine, tier, len(prefix.target))
    assert len(loading.reads) == len(cut(layers, per)) + 1, (len(loading.reads), cut)
    loading.done().wait()
    prefix.release()


CUTS: dict[str, Callable[[int, int], Sequence[int]]] = {
    "even": load.group_starts,
    "growing": growing,
    "growing, halving tail": halving_tail,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--new", type=int, nargs="+", default=[128, 1024, 8192])
    parser.add_argument("--out", default="shapes.json")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="group-shapes-") as folder:
        overrides = [
            "model=deepseek_v3",
            "topology=tp1",
            "topology.device=cuda",
            "bench=ttft",
            "storage=file",
            f"storage.path={folder}",
            f"workload.num_tokens={args.tokens}",
            f"workload.device_tokens={2 * args.tokens}",
            "workload.host_ratio=0.5",
            "strategy.keep_capacity=true",
            *args.overrides,
        ]
        job = pipeline.compose(overrides)
        engine = pipeline.create_engine(job)
        timer, prefix = Timer(engine.runtime, job.bench), Prefix(engine, args.tokens)
        try:
            for new in args.new:
                for name, cut in CUTS.items():
                    load.group_starts = cut
                    _check_cut(engine, prefix, cut)
                    found = time_hit(timer, prefix, DEEPSEEK_V3, new)
                    ms = {
                        k[:-2]: statistics.median(found[k]) * 1e3 for k in found if k.endswith("_s")
                    }
                    ideal = max(ms["load"], ms["compute"])
                    row = {"cut": name, "new_tokens": new, "streamed": prefix.streamed, **ms}
                    row |= {"x_ideal": ms["overlapped"] / ideal, "bit_exact": found["bit_exact"]}
                    rows.append(row)
                    print(
                        f"{new:5d} new, {name:22s}: load {ms['load']:7.1f} compute "
                        f"{ms['compute']:7.1f} overlapped {ms['overlapped']:7.1f} ms, x ideal "
                        f"{row['x_ideal']:.3f} (streamed {prefix.streamed}, bit-exact "
                        f"{found['bit_exact']})",
                        flush=True,
                    )
        finally:
            load.group_starts = CUTS["even"]
            engine.close()
    with open(args.out, "w") as out:
        json.dump({"tokens": args.tokens, "overrides": args.overrides, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
