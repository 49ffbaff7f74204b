"""`bench bench=ttft`: a prefix hit's time to first token against recomputing the prefix.
(Being built: refuses until then.)"""

from __future__ import annotations

from typing import Any

from pipeline.config.compose import Session
from pipeline.spec.checks import ConfigError, Problem


def run_ttft_bench(session: Session) -> dict[str, Any]:
    raise ConfigError([Problem("bench.kind", "bench.kind=ttft is not built yet")])


def ttft_text(result: dict[str, Any]) -> str:
    return str(result)
