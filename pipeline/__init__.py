"""hicache-pipeline: hierarchical KV cache transfers composed from stages in YAML.

The public API (imported on first use, so the engine layers load without Hydra):
`compose`, `create_engine`, `page_keys`, `open_store` (see `pipeline.api`), `Engine`,
`LoadHandle`, `Job`, `StoreView`.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Engine",
    "Job",
    "LoadHandle",
    "StoreView",
    "compose",
    "create_engine",
    "open_store",
    "page_keys",
]
_HOMES = {
    "compose": "pipeline.api",
    "create_engine": "pipeline.api",
    "open_store": "pipeline.api",
    "page_keys": "pipeline.api",
    "StoreView": "pipeline.engine.l3.store_view",
    "Engine": "pipeline.engine.engine",
    "LoadHandle": "pipeline.engine.transfer.executor",
    "Job": "pipeline.config.job",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
