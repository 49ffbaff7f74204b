"""The shipped config files: comments say why without pointing at a tracker, and rotating
takes its stage lists from single_source through Hydra's defaults (one copy, no drift)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import job_config

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_no_shipped_config_comment_names_a_tracker_number() -> None:
    named = [
        f"{path.relative_to(CONF)}:{n}"
        for path in sorted(CONF.rglob("*.yaml"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#.*\b(issue|ticket|bug)\s*#?\d+|#\d+\b", line, re.IGNORECASE)
    ]
    assert named == []


def test_rotating_runs_single_sources_stages_and_spells_none_of_them() -> None:
    assert "_target_" not in (CONF / "strategy" / "rotating.yaml").read_text()
    rotating = job_config("strategy=rotating", "topology=tp2").strategy.config
    single = job_config("strategy=single_source", "topology=tp2").strategy.config
    for direction in ("backup", "load", "l3"):
        assert getattr(rotating, direction) == getattr(single, direction), direction
    assert (rotating.name, rotating.ownership.value, rotating.fallback) == (
        "rotating",
        "rotating",
        "replicated",
    )
