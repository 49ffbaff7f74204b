"""hicache-pipeline: hierarchical KV cache transfers composed from stages in YAML.

The public API (imported on first use, so the engine layers load without Hydra):
`compose`, `create_engine` (see `pipeline.api`), `Engine`, `LoadHandle`, `Job`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Engine", "Job", "LoadHandle", "compose", "create_engine"]
_HOMES = {
    "compose": "pipeline.api",
    "create_engine": "pipeline.api",
    "Engine": "pipeline.engine.engine",
    "LoadHandle": "pipeline.engine.executor",
    "Job": "pipeline.config.job",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
