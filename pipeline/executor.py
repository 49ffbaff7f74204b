"""The executor: walks a pipeline's stage lists over a transfer's steps, on streams.

With ordering=gate every list runs on the transfer stream and the forward gate keeps the next
forward behind the exchange. With ordering=forward_stream the exchange stages of layer i are
issued on the consumer's (forward) stream when it calls `wait(i)`, in layer order, so the
broadcasts take their place among the forward's own collectives.
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
        stage(ctx, step, stream)
        name = type(stage).__name__
        ctx.timings_s[name] = ctx.timings_s.get(name, 0.0) + time.perf_counter() - start


def layers_of(steps: Iterable[Step]) -> dict[int, list[Step]]:
    """Steps grouped by model layer, in order."""
    grouped: dict[int, list[Step]] = {}
    for step in steps:
        grouped.setdefault(step.unit.layer, []).append(step)
    return grouped


class LoadHandle:
    """What `Engine.load` returns: per-layer waits for the forward, and the ack."""

    def __init__(self, ctx: TransferContext, pipeline: Pipeline, copied: dict[int, Event] | None):
        self.ctx = ctx
        self._pipeline = pipeline
        self._copied = copied
        """Per layer, the H2D copies are done (forward_stream ordering only)."""
        self._next_layer = 0
        self._finished = copied is None

    @property
    def num_layers(self) -> int:
        return len(self.ctx.layer_events)

    def wait(self, layer: int, consumer: Stream) -> None:
        """Make `consumer` wait until `layer` is usable on this rank (no host sync on cuda)."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        self._exchange_through(layer, consumer)
        consumer.wait_event(self.ctx.layer_events[layer])

    def ready(self, layer: int) -> bool:
        return self.ctx.layer_events[layer].query()

    def done(self, consumer: Stream) -> Event:
        """The ack: completes after the whole exchange (issues what is left on `consumer`)."""
        self._exchange_through(self.num_layers - 1, consumer)
        if not self._finished:
            self._finished = True
            consumer.submit(lambda: run_stages(self._pipeline.finish, self.ctx, None, consumer))
        return self.ctx.done

    def _exchange_through(self, layer: int, consumer: Stream) -> None:
        if self._copied is None:
            return
        copied = self._copied
        while self._next_layer <= layer:
            i = self._next_layer
            consumer.wait_event(copied[i])
            consumer.submit(lambda i=i: self._exchange_layer(i, consumer))
            self._next_layer += 1

    def _exchange_layer(self, layer: int, consumer: Stream) -> None:
        for step in layers_of(self.ctx.steps)[layer]:
            run_stages(self._pipeline.exchange, self.ctx, step, consumer)


def issue(
    pipeline: Pipeline, ctx: TransferContext, stream: Stream, *, defer_exchange: bool
) -> dict[int, Event] | None:
    """Submit a transfer on `stream`. With `defer_exchange`, return per-layer "copied" events
    and leave the exchange and finish lists to the handle."""
    copied = {layer: stream.new_event() for layer in ctx.layer_events} if defer_exchange else None

    def work() -> None:
        run_stages(pipeline.prepare, ctx, None, stream)
        for step in ctx.steps:
            run_stages(pipeline.per_step, ctx, step, stream)
            if copied is None:
                run_stages(pipeline.exchange, ctx, step, stream)
            elif step.last_in_layer:
                stream.record(copied[step.unit.layer])
        if copied is None:
            run_stages(pipeline.finish, ctx, None, stream)

    stream.submit(work)
    return copied
