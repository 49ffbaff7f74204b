"""Shared test helpers: compose real configs into jobs, and run them on real gloo ranks.

Rank-side functions live in `tests/rankfns.py`; spawned ranks import it by name, which works
because pytest puts this folder on sys.path and spawn hands sys.path to its children.
"""

from __future__ import annotations

from hydra import initialize_config_module

from pipeline.config.compose import Session
from pipeline.config.job import Job


def job_config(*overrides: str) -> Job:
    """The typed job `run` would send to its ranks for these overrides."""
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return Session.compose(list(overrides)).job()
