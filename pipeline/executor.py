"""The executor: walks a pipeline's stage lists over a transfer's steps, on streams.

Copies and exchanges run on different streams. The transfer stream runs `prepare` and every
step's `per_step` (the owner's copies), recording a "copied" event per layer. The `exchange`
list of layer i then runs on a second stream once layer i is copied: the engine's exchange
stream (ordering=gate), or the consumer's forward stream when it calls `wait(i)`
(ordering=forward_stream). So every rank's copies run back to back on its own link while the
broadcasts follow, instead of each layer's copy waiting for the previous layer's broadcast.

`issue_transfer` issues a whole transfer (the gated entry points); with `graphs` the steps and
exchanges are replayed as one CUDA graph per transfer shape (see `pipeline.graphs`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from pipeline.assemble import Pipeline
from pipeline.context import Event, Stage, Stream, TransferContext, layer_steps
from pipeline.graphs import TransferGraphs
from pipeline.plan import Step
from pipeline.streams import CudaStream


def run_stages(
    stages: Iterable[Stage], ctx: TransferContext, step: Step | None, stream: Stream
) -> None:
    for stage in stages:
        start = time.perf_counter()
        try:
            stage(ctx, step, stream)
        except BaseException as e:
            ctx.fail(e)
            raise
        name = type(stage).__name__
        ctx.timings_s[name] = ctx.timings_s.get(name, 0.0) + time.perf_counter() - start


def prepare(pipeline: Pipeline, ctx: TransferContext, stream: Stream) -> None:
    stream.submit(lambda: run_stages(pipeline.prepare, ctx, None, stream))


def issue_steps(pipeline: Pipeline, ctx: TransferContext, stream: Stream) -> None:
    """Every step's `per_step` on `stream`, recording `ctx.copied` per layer (only where there
    is an exchange to wait for it) and `ctx.all_copied` at the end."""
    if pipeline.exchange:
        ctx.copied = {layer: stream.new_event() for layer in ctx.layers}
    copied = ctx.copied

    def work() -> None:
        for step in ctx.steps:
            run_stages(pipeline.per_step, ctx, step, stream)
            if step.last_in_layer and step.unit.layer in copied:
                stream.record(copied[step.unit.layer])
        stream.record(ctx.all_copied)

    stream.submit(work)


def issue_exchanges(
    pipeline: Pipeline, ctx: TransferContext, layers: Iterable[int], stream: Stream
) -> None:
    """The `exchange` list of every step of `layers` on `stream`, each layer behind its copy."""
    if not pipeline.exchange:
        return

    def work() -> None:
        for layer in layers:
            stream.wait_event(ctx.copied[layer])
            for step in layer_steps(ctx, layer):
                run_stages(pipeline.exchange, ctx, step, stream)

    stream.submit(work)


def finish(pipeline: Pipeline, ctx: TransferContext, stream: Stream) -> None:
    stream.submit(lambda: run_stages(pipeline.finish, ctx, None, stream))


def issue_transfer(
    pipeline: Pipeline,
    ctx: TransferContext,
    stream: Stream,
    exchange: Stream,
    graphs: TransferGraphs | None,
) -> None:
    """A whole transfer: copies on `stream`, exchanges on `exchange`, then `finish`.

    With `graphs` (cuda only) the copies and exchanges are one graph replay on `stream`, and
    `finish` runs on `stream` after it.
    """
    prepare(pipeline, ctx, stream)
    if graphs is None:
        issue_steps(pipeline, ctx, stream)
        issue_exchanges(pipeline, ctx, ctx.layers, exchange)
        exchange.wait_event(ctx.all_copied)
        finish(pipeline, ctx, exchange)
        return
    assert isinstance(stream, CudaStream) and isinstance(exchange, CudaStream)

    def body(ctx: TransferContext) -> None:
        issue_steps(pipeline, ctx, stream)
        if pipeline.exchange:
            issue_exchanges(pipeline, ctx, ctx.layers, exchange)
            exchanged = exchange.new_event()
            exchange.record(exchanged)
            stream.wait_event(exchanged)  # a graph ends on the stream it began on

    graphs.issue(pipeline, ctx, stream, exchange, body)
    finish(pipeline, ctx, stream)


class LoadHandle:
    """What `Engine.load` returns: per-layer waits for the forward, and the ack."""

    def __init__(self, ctx: TransferContext, pipeline: Pipeline, *, lazy: bool) -> None:
        self.ctx = ctx
        self._pipeline = pipeline
        self._lazy = lazy
        """Exchanges are issued by the consumer's waits (forward_stream ordering)."""
        self._next_layer = 0
        self._finished = False

    @property
    def num_layers(self) -> int:
        return len(self.ctx.layers)

    def wait(self, layer: int, consumer: Stream) -> None:
        """Make `consumer` wait until `layer` is usable on this rank (no host sync on cuda)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        if self._lazy:
            self._exchange_through(layer, consumer)
        consumer.wait_event(self.ctx.layer_events[layer])

    def ready(self, layer: int) -> bool:
        return self.ctx.layer_events[layer].query()

    def done(self, consumer: Stream) -> Event:
        """The ack: completes after the whole exchange (what is left is issued on `consumer`)."""
        if self._lazy:
            self._exchange_through(self.num_layers - 1, consumer)
            if not self._finished:
                self._finished = True
                consumer.wait_event(self.ctx.all_copied)
                finish(self._pipeline, self.ctx, consumer)
        return self.ctx.done

    def _exchange_through(self, layer: int, stream: Stream) -> None:
        """Issue the exchange of every layer up to `layer` on `stream`, in layer order."""
        layers = range(self._next_layer, layer + 1)
        self._next_layer = max(self._next_layer, layer + 1)
        if layers:
            issue_exchanges(self._pipeline, self.ctx, layers, stream)
