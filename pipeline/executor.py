"""The executor: walks a pipeline's stage lists over a transfer's steps, on streams.

Copies and exchanges run on different streams. The transfer stream runs `prepare` and every
step's `per_step` (the owner's copies), recording a "copied" event per layer. The `exchange`
list of layer i then runs on a second stream once layer i is copied: the engine's exchange
stream (ordering=gate), or the consumer's forward stream when it calls `wait(i)`
(ordering=forward_stream). So every rank's copies run back to back on its own link while the
broadcasts follow, instead of each layer's copy waiting for the previous layer's broadcast.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from pipeline.assemble import Pipeline
from pipeline.context import Event, Stage, Stream, TransferContext
from pipeline.plan import Step


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


def issue_copies(pipeline: Pipeline, ctx: TransferContext, stream: Stream) -> None:
    """`prepare` and every step's `per_step` on `stream`, recording `ctx.copied` per layer
    (only where there is an exchange to wait for it) and `ctx.all_copied` at the end."""
    copied = ctx.copied if pipeline.exchange else {}

    def work() -> None:
        run_stages(pipeline.prepare, ctx, None, stream)
        for step in ctx.steps:
            run_stages(pipeline.per_step, ctx, step, stream)
            if step.last_in_layer and step.unit.layer in copied:
                stream.record(copied[step.unit.layer])
        stream.record(ctx.all_copied)

    stream.submit(work)


def finish(pipeline: Pipeline, ctx: TransferContext, stream: Stream) -> None:
    stream.submit(lambda: run_stages(pipeline.finish, ctx, None, stream))


class LoadHandle:
    """What `Engine.load` returns: per-layer waits for the forward, and the ack."""

    def __init__(self, ctx: TransferContext, pipeline: Pipeline, *, lazy: bool) -> None:
        self.ctx = ctx
        self._pipeline = pipeline
        self._lazy = lazy
        """Exchanges are issued by the consumer's waits (forward_stream ordering)."""
        self._next_layer = 0
        self._finished = False
        self._steps_by_layer: dict[int, list[Step]] | None = None

    @property
    def num_layers(self) -> int:
        return len(self.ctx.layer_events)

    def wait(self, layer: int, consumer: Stream) -> None:
        """Make `consumer` wait until `layer` is usable on this rank (no host sync on cuda)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        if self._lazy:
            self.exchange_through(layer, consumer)
        consumer.wait_event(self.ctx.layer_events[layer])

    def ready(self, layer: int) -> bool:
        return self.ctx.layer_events[layer].query()

    def done(self, consumer: Stream) -> Event:
        """The ack: completes after the whole exchange (what is left is issued on `consumer`)."""
        if self._lazy:
            self.finish(consumer)
        return self.ctx.done

    def finish(self, stream: Stream) -> None:
        """Issue every remaining layer's exchange, then the finish list, on `stream`."""
        self.exchange_through(self.num_layers - 1, stream)
        if not self._finished:
            self._finished = True
            stream.wait_event(self.ctx.all_copied)
            finish(self._pipeline, self.ctx, stream)

    def exchange_through(self, layer: int, stream: Stream) -> None:
        """Issue the exchange of every layer up to `layer` on `stream`, in layer order."""
        layers = range(self._next_layer, layer + 1)
        self._next_layer = max(self._next_layer, layer + 1)
        if layers and self._pipeline.exchange:
            stream.submit(lambda: self._exchange_layers(layers, stream))

    def _exchange_layers(self, layers: range, stream: Stream) -> None:
        for layer in layers:
            stream.wait_event(self.ctx.copied[layer])
            self._exchange_layer(layer, stream)

    def _exchange_layer(self, layer: int, stream: Stream) -> None:
        if self._steps_by_layer is None:  # steps are final once `prepare` has run
            self._steps_by_layer = {}
            for step in self.ctx.steps:
                self._steps_by_layer.setdefault(step.unit.layer, []).append(step)
        for step in self._steps_by_layer[layer]:
            run_stages(self._pipeline.exchange, self.ctx, step, stream)
