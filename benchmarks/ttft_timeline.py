"""Where an overlapped prefix hit loses time: a per-layer timeline of the ttft bench's runs.

Run on a cuda machine from the repository root (one GPU, tp1, the default config):

    python3 benchmarks/ttft_timeline.py --tokens 16384 --new 128 1024 --out timeline.json
    python3 benchmarks/ttft_timeline.py --new 1024 -- storage=file storage.path=/tmp/tl

For the bench's hit (the same `Prefix` and `SyntheticForward`; from the host tier, or from
L3 with a store's overrides) it times the load alone (its end), the forward alone (each
layer's end) and the overlapped run: on the host, when the load's call returned and when
each layer's wait returned (a streamed L3 load's wait returns once its group's reads are
in); on the GPU, each forward layer begun and computed; all from one start. What it prints:
the ends, and per group of layers (every sixth layer for the host tier) the host's wait,
the layer's begin and end, and the forward alone's end of that layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import pipeline
from pipeline.engine.cuda.streams import CudaStream
from pipeline.engine.l3.load import StreamedLoad
from pipeline.jobs.bench.forward import DEEPSEEK_V3, SyntheticForward
from pipeline.jobs.bench.ttft_case import Prefix


class Clock:
    """GPU timing events on the forward stream and host times, read against one start."""

    def __init__(self, forward: CudaStream) -> None:
        self.forward = forward
        self.start = torch.cuda.Event(enable_timing=True)
        self.began = 0.0
        self.marks: dict[str, list[torch.cuda.Event]] = {}
        self.host: dict[str, list[float]] = {}

    def begin(self) -> None:
        self.marks, self.host = {}, {}
        self.start.record(self.forward.stream)
        self.began = time.perf_counter()

    def mark(self, name: str) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.forward.stream)
        self.marks.setdefault(name, []).append(event)

    def now(self, name: str) -> None:
        self.host.setdefault(name, []).append((time.perf_counter() - self.began) * 1e3)

    def read(self) -> dict[str, list[float]]:
        torch.cuda.synchronize()
        gpu = {n: [self.start.elapsed_time(e) for e in events] for n, events in self.marks.items()}
        return gpu | {f"host_{n}": times for n, times in self.host.items()}


def run(args: argparse.Namespace) -> dict:
    overrides = [
        "model=deepseek_v3",
        "topology=tp1",
        "topology.device=cuda",
        f"workload.num_tokens={args.tokens}",
        f"workload.device_tokens={3 * args.tokens}",
        *args.overrides,
    ]
    engine = pipeline.create_engine(pipeline.compose(overrides))
    fwd = engine.runtime.forward_stream
    assert isinstance(fwd, CudaStream), "a cuda engine's forward is a CUDA stream"
    clock, prefix, layers = Clock(fwd), Prefix(engine, args.tokens), engine.model.num_layers
    forward = SyntheticForward(
        DEEPSEEK_V3, layers, engine.runtime.device, prefix=args.tokens, new=args.new
    )
    loaded = prefix.layers()
    streamed = []

    def load_alone() -> None:
        loading = prefix.load()
        clock.now("returned")
        fwd.wait_event(loading.done(fwd))
        clock.mark("done")

    def compute_alone() -> None:
        for layer in range(layers):
            fwd.submit(lambda layer=layer: forward.layer(layer, loaded[layer], []))
            clock.mark("computed")

    def overlapped() -> None:
        loading = prefix.load()
        clock.now("returned")
        streamed.append(isinstance(loading, StreamedLoad))
        for layer in range(layers):
            loading.wait(layer, fwd)
            clock.now("waited")
            clock.mark("begun")
            fwd.submit(lambda layer=layer: forward.layer(layer, loaded[layer], []))
            clock.mark("computed")
        fwd.wait_event(loading.done(fwd))
        clock.mark("done")

    result: dict = {"tokens": args.tokens, "new": args.new, "overrides": args.overrides}
    for name, region in (("load", load_alone), ("compute", compute_alone), ("both", overlapped)):
        samples = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            clock.begin()
            region()
            samples.append(clock.read())
            prefix.release()
        result[name] = {
            key: [statistics.median(s[key][i] for s in samples) for i in range(len(values))]
            for key, values in samples[-1].items()
        }
    result["streamed"] = all(streamed)
    engine.close()
    return result


def summary(result: dict) -> str:
    load, compute, both = result["load"], result["compute"], result["both"]
    lines = [
        f"{result['tokens']} tokens + {result['new']} new {' '.join(result['overrides'])} "
        f"(streamed: {result['streamed']}): load alone returned {load['host_returned'][0]:.2f} "
        f"done {load['done'][-1]:.2f} ms; compute alone {compute['computed'][-1]:.2f} ms; "
        f"overlapped returned {both['host_returned'][0]:.2f}, computed(last) "
        f"{both['computed'][-1]:.2f}, done {both['done'][-1]:.2f} ms"
    ]
    waits = both["host_waited"]
    # a layer whose wait returned later than the one before's by more than a layer's compute
    # starts a group
    shown = [0, *(i for i in range(1, len(waits)) if waits[i] - waits[i - 1] > 0.5)]
    if len(shown) < 3:
        shown = list(range(0, len(waits), 6))
    for layer in [*shown, len(waits) - 1]:
        lines.append(
            f"  layer {layer:2d}: host waited {waits[layer]:7.2f}; begun "
            f"{both['begun'][layer]:7.2f} computed {both['computed'][layer]:7.2f} "
            f"(alone {compute['computed'][layer]:7.2f})"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--new", type=int, nargs="+", default=[128])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default="timeline.json")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    results = []
    for new in args.new:
        results.append(run(argparse.Namespace(**{**vars(args), "new": new})))
        print(summary(results[-1]), flush=True)
    with open(args.out, "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
