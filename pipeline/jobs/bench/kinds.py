"""The benches other than `transfers` (bench.kind): each a run over the checked session
(its result has "ok": every row held; {} on a torchrun rank other than 0) and its text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.config.compose import Session
from pipeline.config.drive_schemas import BenchKind
from pipeline.jobs.bench.links import links_text, run_links_bench
from pipeline.jobs.bench.ttft import run_ttft_bench, ttft_text

Run = Callable[[Session], dict[str, Any]]
Text = Callable[[dict[str, Any]], str]

OTHER_BENCHES: dict[BenchKind, tuple[Run, Text]] = {
    BenchKind.links: (run_links_bench, links_text),
    BenchKind.ttft: (run_ttft_bench, ttft_text),
}
