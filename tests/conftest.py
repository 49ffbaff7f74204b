"""Shared test helpers: compose real configs, and run jobs on real gloo ranks.

Rank-side functions live in `tests/rankfns.py`; spawned ranks import it by name, which works
because pytest puts this folder on sys.path and spawn hands sys.path to its children.
"""

from __future__ import annotations

from hydra import initialize_config_module

from pipeline.config import Session


def job_config(*overrides: str) -> dict:
    """The effective, plain config `run` would send to its ranks."""
    with initialize_config_module(config_module="conf", version_base="1.3"):
        plain, _ = Session.compose(list(overrides)).effective()
    return plain
