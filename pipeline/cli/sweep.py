"""`-m`: a sweep. One job per combination of the overrides' values, run one after another in
this process; each job's result is kept (nothing is written to disk), a failed or refused job
is a row of the summary like any other, and the exit code is the worst job's."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from collections.abc import Callable
from typing import Any

from pipeline.config.app import CommandLine
from pipeline.config.untrusted import sweep_jobs
from pipeline.jobs.progress import progress
from pipeline.jobs.report import printable

Runner = Callable[[CommandLine], int]
VERDICTS = {0: "ok", 1: "failed", 2: "config error"}


def run_sweep(run_one: Runner, line: CommandLine) -> int:
    """Every job of the sweep through `run_one` (`--json`: one JSON object per job, a line
    each, as each ends; else a summary table at the end). Progress goes to stderr."""
    jobs = sweep_jobs(line.overrides)
    rows = []
    for i, overrides in enumerate(progress(jobs, "sweep jobs")):
        row = one_job(run_one, dataclasses.replace(line, overrides=overrides, multirun=False))
        row = {"job": i, "overrides": overrides, **row}
        rows.append(row)
        if line.as_json:
            print(json.dumps(row), flush=True)
    if not line.as_json:
        print(summary(rows))
    return max(row["exit_code"] for row in rows)


def one_job(run_one: Runner, line: CommandLine) -> dict[str, Any]:
    """A job's exit code, verdict, result (its JSON document) and, when it did not pass, why
    (the last line it said on stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_one(dataclasses.replace(line, as_json=True))
    try:
        result = json.loads(out.getvalue())
    except json.JSONDecodeError:
        result = None
    said = [s for s in err.getvalue().splitlines() if s.strip()]
    why = said[-1].removeprefix("error: ") if code and said else ""
    if code and isinstance(result, dict) and "error" in result:  # why it failed, not a result
        why, result = printable(result["error"]), None
    return {
        "exit_code": code,
        "verdict": VERDICTS.get(code, "failed"),
        "why": why,
        "result": result,
    }


def figures(result: Any) -> str:
    """A job's key figures: the scalar fields at the top of its result."""
    if not isinstance(result, dict):
        return ""
    scalars = [(k, v) for k, v in result.items() if isinstance(v, bool | int | float | str)]
    return ", ".join(f"{k}={v}" for k, v in scalars[:5])


def summary(rows: list[dict[str, Any]]) -> str:
    lines = ["| job | overrides | verdict | key figures |", "| ---: | --- | --- | --- |"]
    for row in rows:
        verdict = row["verdict"] + (f": {row['why']}" if row["why"] else "")
        shown = " ".join(row["overrides"])
        lines.append(
            f"| {row['job']} | {printable(shown)} | {printable(verdict)} "
            f"| {printable(figures(row['result']))} |"
        )
    return "\n".join(lines)
