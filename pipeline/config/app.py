"""The Hydra app behind every subcommand: overrides, `--cfg`, `--help`, `--config-dir`, `-m`."""

from __future__ import annotations

import sys
from collections.abc import Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline.config.compose import Session


def hydra_main(command: str, args: list[str], task: Callable[[Session], int]) -> None:
    """Compose the config from `args` through Hydra's app and run `task` on it; a non-zero
    return becomes the exit code."""

    def main(cfg: DictConfig) -> None:
        hc = HydraConfig.get()
        code = task(Session(cfg, tuple(hc.overrides.task), hc.runtime.choices["strategy"]))
        if code:
            raise SystemExit(code)

    sys.argv = [f"hicache-pipeline {command}", *args]
    hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")(main)()
