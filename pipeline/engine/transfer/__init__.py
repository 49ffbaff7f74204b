"""The transfer core: how one backup or load of one rank is issued, whatever the strategy.

A strategy is two `Pipeline`s (backup, load) of stages, each of one of the two kinds below.
`state` holds what a stage sees (`Resources` for the engine's lifetime, a `Transfer` per
backup or load); `executor` walks a pipeline's lists over a transfer's steps on streams, and
`graphs` captures that walk once per transfer shape and replays it (CUDA graphs). `pools` are
the device and host pools the copies read and write, in every layout; `batches` the two
buffers a chunked backup gathers its batches into.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


@runtime_checkable
class TransferStage(Protocol):
    """A stage run once per transfer: the prepare and finish lists."""

    def on_transfer(self, t: Transfer, stream: Stream) -> None: ...


@runtime_checkable
class StepStage(Protocol):
    """A stage run for every step: the per_step and exchange lists."""

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None: ...


@dataclass(frozen=True)
class Pipeline:
    """One direction's stages (see `PipelineConfig` for when each list runs)."""

    prepare: tuple[TransferStage, ...] = ()
    per_step: tuple[StepStage, ...] = ()
    exchange: tuple[StepStage, ...] = ()
    finish: tuple[TransferStage, ...] = ()
