"""The executor: walks a pipeline's stage lists over a transfer's steps, on streams.

Copies and exchanges run on different streams. The transfer stream runs `prepare` and every
step's `per_step` (the owner's copies), recording a "copied" event per layer. The `exchange`
list of layer i then runs on a second stream once layer i is copied: the engine's exchange
stream (ordering=gate), or the consumer's forward stream when it calls `wait(i)`
(ordering=forward_stream). So every rank's copies run back to back on its own link while the
broadcasts follow, instead of each layer's copy waiting for the previous layer's broadcast.

`issue_transfer` issues a whole transfer (the gated entry points); with `graphs` the steps and
exchanges are replayed as one CUDA graph per transfer shape (see `pipeline.engine.transfer.graphs`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import CudaStream, Event, Stream
from pipeline.engine.transfer import Pipeline, TransferStage
from pipeline.engine.transfer.graphs import TransferGraphs
from pipeline.engine.transfer.state import Transfer


class _Timed:
    """Adds a block's time to its stages' (one entry per stage list: timing every call of a
    per-step list would cost the issue path more than most of its stages); an error fails
    the transfer. A class rather than a contextmanager, whose generator and wrapper are
    more calls on every transfer."""

    def __init__(self, t: Transfer, stages: Sequence[object]) -> None:
        self.t, self.stages = t, stages
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        if error is not None:
            self.t.fail(error)
        name = "+".join(type(stage).__name__ for stage in self.stages)
        timings = self.t.res.timings_s
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - self.start


def run_once(stages: Sequence[TransferStage], t: Transfer, stream: Stream) -> None:
    """Each stage once; nothing once the transfer has failed."""
    for stage in stages:
        if t.error is None:
            with _Timed(t, (stage,)):
                stage.on_transfer(t, stream)


def prepare(pipeline: Pipeline, t: Transfer, stream: Stream) -> None:
    stream.submit(lambda: run_once(pipeline.prepare, t, stream))


def finish(pipeline: Pipeline, t: Transfer, stream: Stream) -> None:
    stream.submit(lambda: run_once(pipeline.finish, t, stream))


def issue_copies(
    pipeline: Pipeline,
    t: Transfer,
    stream: Stream,
    steps: Sequence[Step] | None = None,
    *,
    last: bool = True,
) -> None:
    """The `per_step` list of `steps` (default: every step) on `stream`, recording `t.copied`
    per layer (only where there is an exchange to wait for it) and, with `last`,
    `t.all_copied` at the end (a streamed load issues its steps a group at a time)."""
    if pipeline.exchange and not t.copied:
        t.copied = t.plan.layout.layer_events(stream.new_event)
    copied = t.copied
    calls = [stage.on_step for stage in pipeline.per_step]
    walk = t.plan.steps if steps is None else steps

    def work() -> None:
        with _Timed(t, pipeline.per_step):
            for step in walk:
                if t.error is not None:
                    return
                for call in calls:
                    call(t, step, stream)
                if copied and step.last_in_layer and step.unit.layer in copied:
                    stream.record(copied[step.unit.layer])
        if last:
            stream.record(t.all_copied)

    stream.submit(work)


def issue_exchanges(pipeline: Pipeline, t: Transfer, layers: Iterable[int], stream: Stream) -> None:
    """The `exchange` list of every step of `layers` on `stream`, each layer behind its copy."""
    if not pipeline.exchange:
        return

    calls = [stage.on_step for stage in pipeline.exchange]

    def work() -> None:
        with _Timed(t, pipeline.exchange):  # once for all of `layers`, not per layer
            for layer in layers:
                stream.wait_event(t.copied[layer])
                for step in t.plan.layer_steps(layer):
                    if t.error is not None:
                        return
                    for call in calls:
                        call(t, step, stream)

    stream.submit(work)


def issue_transfer(
    pipeline: Pipeline,
    t: Transfer,
    stream: Stream,
    exchange: Stream,
    graphs: TransferGraphs | None,
) -> None:
    """A whole transfer: copies on `stream`, exchanges on `exchange`, then `finish`.

    With `graphs` (cuda only) the copies and exchanges are one graph replay on `stream`, and
    `finish` runs on `stream` after it.
    """
    prepare(pipeline, t, stream)
    if graphs is None:
        issue_copies(pipeline, t, stream)
        issue_exchanges(pipeline, t, t.layers, exchange)
        exchange.wait_event(t.all_copied)
        finish(pipeline, t, exchange)
        return
    assert isinstance(stream, CudaStream) and isinstance(exchange, CudaStream)

    def body(t: Transfer) -> None:
        issue_copies(pipeline, t, stream)
        if pipeline.exchange:
            issue_exchanges(pipeline, t, t.layers, exchange)
            exchanged = exchange.new_event()
            exchange.record(exchanged)
            stream.wait_event(exchanged)  # a graph ends on the stream it began on

    graphs.issue(pipeline, t, stream, exchange, body)
    finish(pipeline, t, stream)


class LoadHandle:
    """What `Engine.load` returns: per-layer waits for the forward, and the ack."""

    def __init__(self, t: Transfer, pipeline: Pipeline, *, lazy: bool, forward: Stream) -> None:
        self.transfer = t
        self.forward = forward
        """The consumer when a wait names none: the engine's forward stream (on cuda, the
        stream that was current when the engine started)."""
        self._pipeline = pipeline
        self._lazy = lazy
        """Exchanges are issued by the consumer's waits (forward_stream ordering)."""
        self._next_layer = 0
        self._finished = False

    @property
    def num_layers(self) -> int:
        return len(self.transfer.layers)

    def wait(self, layer: int, consumer: Stream | None = None) -> None:
        """Make `consumer` (default: the forward stream) wait until `layer` is usable on this
        rank (no host sync on cuda); raises at once for a transfer that has failed."""
        consumer = consumer or self.forward
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside 0..{self.num_layers - 1}")
        if self.transfer.error is not None:
            raise RuntimeError(f"transfer failed: {self.transfer.error}") from self.transfer.error
        if self._lazy:
            self._exchange_through(layer, consumer)
        consumer.wait_event(self.transfer.layer_events[layer])

    def ready(self, layer: int) -> bool:
        """Has `layer` landed on this rank? Rank-local, like `query`."""
        return self.transfer.layer_events[layer].query()

    def query(self) -> bool:
        """Has the whole load landed on this rank? Rank-local, no collective: one rank may
        wait on it alone (`Engine.poll`, a collective, then releases the ack on every rank).
        Under `strategy.ordering=forward_stream` the exchanges are issued by the waits, so
        call `done()` first or this never turns true."""
        return self.transfer.done.query()

    def done(self, consumer: Stream | None = None) -> Event:
        """The ack: completes after the whole exchange (what is left is issued on `consumer`,
        default: the forward stream)."""
        t, consumer = self.transfer, consumer or self.forward
        if self._lazy:
            self._exchange_through(self.num_layers - 1, consumer)
            if not self._finished:
                self._finished = True
                consumer.wait_event(t.all_copied)
                finish(self._pipeline, t, consumer)
        return t.done

    def _exchange_through(self, layer: int, stream: Stream) -> None:
        """Issue the exchange of every layer up to `layer` on `stream`, in layer order."""
        layers = range(self._next_layer, layer + 1)
        self._next_layer = max(self._next_layer, layer + 1)
        if layers:
            issue_exchanges(self._pipeline, self.transfer, layers, stream)
