"""What every bench shares: its cases must fit this machine, and one launch runs them all."""

from __future__ import annotations

from typing import Any

from pipeline.config.job import Job
from pipeline.core.checks import raise_problems
from pipeline.jobs.launch import launch
from pipeline.jobs.resources import resource_problems
from pipeline.jobs.spawn import RankFn


def check_fit(cases: list[tuple[Job, dict]]) -> None:
    """ConfigError unless this machine holds each case's pools (one case at a time)."""
    for job, _ in cases:
        raise_problems(resource_problems(job))


def launch_cases(fn: RankFn, base: Job, cases: list[tuple[Job, dict]]) -> list[Any] | None:
    """`fn((base, cases), rank, ...)` on every rank; each case may take up to a collective
    timeout."""
    timeout_s = base.runtime.timeout_s
    return launch(
        fn,
        (base, cases),
        base.topology.tp_size,
        backend=base.recipe().backend_name(),
        timeout_s=timeout_s,
        job_s=timeout_s * (len(cases) + 1),
    )
