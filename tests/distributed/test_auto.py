"""`run strategy=auto` on real gloo ranks: the winner runs bit-exact and the report names it
and says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("overrides", "winner"),
    [
        (("topology=tp2",), "rotating"),
        (("topology=tp1",), "replicated"),  # the only active strategy
        (("topology=tp2", "storage=file"), "rotating"),
    ],
)
def test_auto_runs_the_winner_bit_exact_and_its_report_names_it(
    tmp_path: Path, overrides: tuple[str, ...], winner: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "strategy=auto", *overrides, "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verified"] and report["strategy"] == report["effective_strategy"] == winner
    (note,) = [n for n in report["notes"] if n.startswith("strategy=auto picked")]
    assert note.startswith(f"strategy=auto picked {winner}: estimated ")
    assert "(links h200)" in note
    text = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "strategy=auto", *overrides],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert text.returncode == 0, text.stderr
    assert f"note: strategy=auto picked {winner}" in text.stdout
    assert "verified: bit-exact" in text.stdout
