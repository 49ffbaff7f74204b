"""Where an overlapped prefix hit loses time: a per-layer timeline of the ttft bench's runs.

Run on a cuda machine from the repository root (one GPU, tp1):

    python3 benchmarks/ttft_timeline.py --tokens 16384 --new 128 --out timeline.json

For the bench's host hit (the same `Prefix` and `SyntheticForward`) it times, on the GPU, the
load alone (when each layer becomes usable), the forward alone (each layer's end) and the
overlapped run (each layer usable, each layer's compute begun and ended), all from one start
event recorded before the load is issued, and the host time the overlapped run's issue took.
What it prints per run: the last layer's times, and the first layer where the forward falls
behind its own pace alone.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist

import pipeline
from pipeline.engine.cuda.streams import CudaStream
from pipeline.jobs.bench.forward import DEEPSEEK_V3, SyntheticForward
from pipeline.jobs.bench.ttft_case import Prefix


class Clock:
    """Timing events on the forward stream and on a watcher stream that sees each layer
    become usable, all read against one start event."""

    def __init__(self, forward: CudaStream) -> None:
        self.forward = forward
        watcher = torch.cuda.Stream()
        self.watcher = CudaStream(watcher, forward.timeout_s, forward.api)
        self.start = torch.cuda.Event(enable_timing=True)
        self.marks: dict[str, list[torch.cuda.Event]] = {}

    def begin(self) -> None:
        self.marks = {}
        self.start.record(self.forward.stream)

    def mark(self, name: str, stream: CudaStream) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream.stream)
        self.marks.setdefault(name, []).append(event)

    def read(self) -> dict[str, list[float]]:
        torch.cuda.synchronize()
        return {
            name: [self.start.elapsed_time(e) for e in events]
            for name, events in self.marks.items()
        }


def run(args: argparse.Namespace) -> dict:
    job = pipeline.compose(
        [
            "model=deepseek_v3",
            "topology=tp1",
            "topology.device=cuda",
            "topology.io_backend=direct",
            "topology.mem_layout=page_first_direct",
            f"workload.num_tokens={args.tokens}",
            f"workload.device_tokens={3 * args.tokens}",
            *args.overrides,
        ]
    )
    engine = pipeline.create_engine(job)
    forward_stream = engine.runtime.forward_stream
    assert isinstance(forward_stream, CudaStream), "a cuda engine's forward is a CUDA stream"
    clock = Clock(forward_stream)
    prefix = Prefix(engine, args.tokens)
    layers = engine.model.num_layers
    forward = SyntheticForward(
        DEEPSEEK_V3, layers, engine.runtime.device, prefix=args.tokens, new=args.new
    )
    loaded = prefix.layers()

    def watch(loading) -> None:  # each layer's usable time, seen from a stream of its own
        for layer in range(layers):
            loading.wait(layer, clock.watcher)
            clock.mark("usable", clock.watcher)

    def load_alone() -> None:
        loading = prefix.load()
        watch(loading)
        forward_stream.wait_event(loading.done(forward_stream))
        clock.mark("done", forward_stream)

    def compute_alone() -> None:
        for layer in range(layers):
            forward_stream.submit(lambda layer=layer: forward.layer(layer, loaded[layer], []))
            clock.mark("computed", forward_stream)

    def overlapped() -> None:
        loading = prefix.load()
        watch(loading)
        for layer in range(layers):
            loading.wait(layer, forward_stream)
            clock.mark("begun", forward_stream)
            forward_stream.submit(lambda layer=layer: forward.layer(layer, loaded[layer], []))
            clock.mark("computed", forward_stream)
        forward_stream.wait_event(loading.done(forward_stream))
        clock.mark("done", forward_stream)

    result: dict = {"tokens": args.tokens, "new": args.new}
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
    engine.close()
    return result


def summary(result: dict) -> str:
    load, compute, both = result["load"], result["compute"], result["both"]
    lines = [
        f"{result['tokens']} tokens + {result['new']} new: load alone usable(last) "
        f"{load['usable'][-1]:.2f} done {load['done'][-1]:.2f} ms; compute alone "
        f"{compute['computed'][-1]:.2f} ms; overlapped usable(last) {both['usable'][-1]:.2f}, "
        f"computed(last) {both['computed'][-1]:.2f}, done {both['done'][-1]:.2f} ms"
    ]
    for layer in range(0, len(both["usable"]), 6):
        lines.append(
            f"  layer {layer:2d}: usable alone {load['usable'][layer]:7.2f} overlapped "
            f"{both['usable'][layer]:7.2f}; begun {both['begun'][layer]:7.2f} computed "
            f"{both['computed'][layer]:7.2f} (alone {compute['computed'][layer]:7.2f})"
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
