"""A strategy ready to run: its config (ownership, knobs) and its instantiated stage lists."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.strategy import StrategyConfig
from pipeline.engine.l3.tier import ObjectStage
from pipeline.engine.transfer import Pipeline


@dataclass(frozen=True)
class L3Pipeline:
    """The L3 tier's stages (see `L3PipelineConfig`)."""

    write_back: tuple[ObjectStage, ...] = ()
    fetch: tuple[ObjectStage, ...] = ()


@dataclass(frozen=True)
class Strategy:
    """What an engine runs: the strategy's config, its two pipelines and its L3 stages."""

    config: StrategyConfig
    backup: Pipeline
    load: Pipeline
    l3: L3Pipeline = L3Pipeline()
