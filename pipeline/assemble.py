"""cfg.strategy -> Strategy: stage lists instantiated from `_target_` entries inside `stages`.

A config must not be able to run arbitrary code, so a `_target_` outside the `stages` package is
refused here (before importing anything) and by `validate`; stage arguments are bound against
the stage's signature so a misspelt knob fails with its file and key.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.context import Stage
from pipeline.schema import IdleSyncSkipConfig, Ordering, Ownership, StrategyConfig

STAGE_PACKAGE = "stages"
PIPELINE_LISTS = ("prepare", "per_step", "exchange", "finish")


@dataclass(frozen=True)
class Pipeline:
    """One direction's stage lists (see `PipelineConfig` for when each list runs)."""

    prepare: tuple[Stage, ...]
    per_step: tuple[Stage, ...]
    exchange: tuple[Stage, ...]
    finish: tuple[Stage, ...]


@dataclass(frozen=True)
class Strategy:
    """A strategy ready to run: its ownership, knobs and instantiated pipelines."""

    name: str
    ownership: Ownership
    ordering: Ordering
    staging_bytes: int
    chunk_pages: int
    verify_every: int
    keep_capacity: bool
    idle_sync_skip: IdleSyncSkipConfig
    poll_timer_every: int
    cuda_graphs: int
    backup: Pipeline
    load: Pipeline


def resolve_stage_class(target: str) -> type:
    """Import `stages.<module>.<Class>`; ValueError for anything outside the package."""
    module_name, _, class_name = target.rpartition(".")
    if not (module_name == STAGE_PACKAGE or module_name.startswith(STAGE_PACKAGE + ".")):
        raise ValueError(
            f"_target_ {target!r} lies outside the '{STAGE_PACKAGE}' package; "
            "configs may only name stages"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"_target_ {target!r} does not name a stage: {e}") from e
    if not inspect.isclass(cls) or not callable(cls):
        raise ValueError(f"_target_ {target!r} is not a stage class")
    return cls


def stage_arguments(node: Any) -> tuple[str, dict[str, Any]]:
    """(target, kwargs) of one stage entry; ValueError when it is not a `_target_` mapping."""
    entry = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(entry, dict) or "_target_" not in entry:
        raise ValueError(f"stage entry {entry!r} must be a mapping with a _target_")
    kwargs = {str(k): v for k, v in entry.items() if k != "_target_"}
    return str(entry["_target_"]), kwargs


def check_stage(node: Any) -> type:
    """Resolve the class and bind the arguments to its signature (constructs nothing)."""
    target, kwargs = stage_arguments(node)
    cls = resolve_stage_class(target)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"arguments {sorted(kwargs)} do not fit {target}: {e}") from e
    return cls


def build_stage(node: Any) -> Stage:
    _, kwargs = stage_arguments(node)
    stage: Stage = check_stage(node)(**kwargs)
    return stage


def assemble(strategy: DictConfig) -> Strategy:
    """Instantiate the stage lists of a composed `strategy` node."""
    typed: StrategyConfig = OmegaConf.to_object(strategy)  # type: ignore[assignment]

    def pipeline(direction: str) -> Pipeline:
        lists = {
            name: tuple(build_stage(n) for n in strategy[direction][name])
            for name in PIPELINE_LISTS
        }
        return Pipeline(**lists)

    return Strategy(
        name=typed.name,
        ownership=typed.ownership,
        ordering=typed.ordering,
        staging_bytes=typed.staging_bytes,
        chunk_pages=typed.chunk_pages,
        verify_every=typed.verify_every,
        keep_capacity=typed.keep_capacity,
        idle_sync_skip=typed.idle_sync_skip,
        poll_timer_every=typed.poll_timer_every,
        cuda_graphs=typed.cuda_graphs,
        backup=pipeline("backup"),
        load=pipeline("load"),
    )


def stage_errors(strategy: DictConfig, where: str) -> list[str]:
    """Every stage problem of a strategy node, each prefixed with `where` and the key."""
    errors = []
    for direction in ("backup", "load"):
        for name in PIPELINE_LISTS:
            for i, node in enumerate(strategy[direction][name]):
                try:
                    check_stage(node)
                except ValueError as e:
                    errors.append(f"{where}: strategy.{direction}.{name}[{i}]: {e}")
    return errors
