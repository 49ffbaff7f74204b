"""BENCHMARKS.md as current results: its tables are docs/tools/results_tables.py's output from the
committed result files, every row names its commit and the run's date, hardware and command,
the file keeps to its size budget and to dates and trees (no session log), and the history it
replaced is kept byte for byte."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "docs/benchmarks/results"
HISTORY = ROOT / "docs/benchmarks/history/2026-12-05-benchmarks-before-the-rewrite.md"
HISTORY_SHA256 = "2f5ee3f722d8eadd6b71d41f75f3eeacac88ee1948a3ecd2a3ab9f1e982146c6"
"""sha256 of BENCHMARKS.md at b9554ca, the last commit before the rewrite."""
FIELDS = {"what", "commit", "date", "hardware", "software", "command", "paths", "source"}
SESSION_WORDING = re.compile(r"Session \d|this session", re.IGNORECASE)


def generator() -> ModuleType:
    """The script, imported as it runs (it imports `generated` from beside it)."""
    spec = importlib.util.spec_from_file_location(
        "results_tables", ROOT / "docs/tools/results_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "docs/tools"))
        spec.loader.exec_module(module)
    return module


def blocks(text: str) -> dict[str, str]:
    """Each generated block's body by name."""
    pattern = r"<!-- generated:([\w-]+) -->\n(.*?)\n<!-- /generated:\1 -->"
    return dict(re.findall(pattern, text, re.DOTALL))


def tables(body: str) -> list[list[dict[str, str]]]:
    """The Markdown tables of a block, each as its rows by column name."""
    found = []
    for chunk in re.split(r"\n\s*\n", body):
        lines = [line for line in chunk.splitlines() if line.startswith("|")]
        names = [c.strip() for c in lines[0].strip("|").split("|")]
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
        found.append([dict(zip(names, row, strict=True)) for row in rows])
    return found


def commits(cell: str) -> list[str]:
    """'5112da9 (stale) / 11fd460 (stale)' -> ['5112da9', '11fd460']."""
    return [part.split()[0] for part in cell.split(" / ")]


@pytest.mark.skipif(shutil.which("git") is None, reason="the stale flags need git")
def test_the_generated_tables_are_the_result_files_output(capsys: pytest.CaptureFixture) -> None:
    assert generator().main(["--check"]) == 0, capsys.readouterr().out


def test_every_result_file_names_its_commit_date_hardware_software_command_and_source() -> None:
    files = sorted(RESULTS.glob("*/result.json"))
    assert len(files) >= 10
    for path in files:
        result = json.loads(path.read_text())
        assert result.keys() >= FIELDS, (path, FIELDS - result.keys())
        assert all(result[f] for f in FIELDS), path
        assert len(result.keys() & {"raw", "raw_l3", "rows"}) == 1, path
        assert result["source"].startswith(("raw bench JSON", "transcribed from", "computed")), path
        for name in result.get("raw", []) + result.get("raw_l3", []):
            assert (path.parent / name).is_file(), (path, name)


def test_every_row_names_a_run_with_its_date_hardware_and_command() -> None:
    found = blocks(BENCHMARKS.read_text())
    assert set(found) == {
        "tp2-matrix",
        "issue-time",
        "ttft",
        "vllm-ttft",
        "l3-limits",
        "cost-model",
    }
    for name, body in found.items():
        rows, runs = tables(body)
        by_commit = {commits(run["commit"])[0]: run for run in runs}
        assert rows, name
        for row in rows:
            for commit in commits(row["commit"]):
                run = by_commit[commit]
                assert run["date"] and run["hardware"] and run["command"], (name, commit)


def test_the_readme_table_has_at_most_eight_rows_each_with_its_conditions() -> None:
    (rows,) = tables(generator().readme())
    assert 1 <= len(rows) <= 8
    for row in rows:
        assert all(row[c] for c in ("what", "figure", "x limit", "hardware", "commit", "date"))


def test_a_block_is_rewritten_between_its_markers_and_the_rest_is_kept() -> None:
    text = "head\n<!-- generated:readme-results -->\nold\n<!-- /generated:readme-results -->\ntail"
    filled = generator().fill(text, {"readme-results": lambda: "new"})
    assert (
        filled
        == "head\n<!-- generated:readme-results -->\nnew\n<!-- /generated:readme-results -->\ntail"
    )


def test_benchmarks_keeps_to_its_size_budget() -> None:
    assert len(BENCHMARKS.read_bytes()) <= 40_000


def test_benchmarks_and_its_results_name_dates_and_trees_not_sessions() -> None:
    paths = [BENCHMARKS, *RESULTS.rglob("*.md"), *RESULTS.rglob("*.json"), *RESULTS.rglob("*.py")]
    assert [p for p in paths if SESSION_WORDING.search(p.read_text())] == []


def test_the_history_before_the_rewrite_is_kept_byte_for_byte() -> None:
    assert hashlib.sha256(HISTORY.read_bytes()).hexdigest() == HISTORY_SHA256
