"""`bench bench=links`: this machine's link speeds for the cost model (`runtime.links`).
(Being built: refuses until then.)"""

from __future__ import annotations

from typing import Any

from pipeline.config.compose import Session
from pipeline.spec.checks import ConfigError, Problem


def run_links_bench(session: Session) -> dict[str, Any]:
    raise ConfigError([Problem("bench.kind", "bench.kind=links is not built yet")])


def links_text(result: dict[str, Any]) -> str:
    return str(result)
