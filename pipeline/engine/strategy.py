"""A strategy ready to run: its config (ownership, knobs) and its instantiated stage lists."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.engine.transfer import StepStage, TransferStage
from pipeline.spec.strategy import StrategyConfig


@dataclass(frozen=True)
class Pipeline:
    """One direction's stages (see `PipelineConfig` for when each list runs)."""

    prepare: tuple[TransferStage, ...] = ()
    per_step: tuple[StepStage, ...] = ()
    exchange: tuple[StepStage, ...] = ()
    finish: tuple[TransferStage, ...] = ()


@dataclass(frozen=True)
class Strategy:
    """What an engine runs: the strategy's config and its two pipelines."""

    config: StrategyConfig
    backup: Pipeline
    load: Pipeline
