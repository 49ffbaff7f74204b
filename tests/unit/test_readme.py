"""README's Mooncake block for library users runs as written against a master started the
way README says (the project's own flags), and README's shown command outputs are each
produced by a test or marked abridged."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.jobs.l3_store import master_on_loopback

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def block_after(heading: str, fence: str) -> str:
    section = README[README.index(heading) :]
    start = section.index(f"```{fence}\n") + len(f"```{fence}\n")
    return section[start : section.index("```\n", start)]


@pytest.mark.mooncake
def test_the_mooncake_block_for_library_users_runs_as_written(tmp_path: Path) -> None:
    command = block_after("**Mooncake from a serving engine**", "bash").split()
    assert command[0] == "mooncake_master" and "--rpc_address=127.0.0.1" in command
    assert "--metrics_host=127.0.0.1" in command  # as the project starts its own
    with master_on_loopback() as (master, metadata):
        assert metadata in block_after("**Mooncake from a serving engine**", "python")
        script = tmp_path / "mooncake_example.py"
        code = block_after("**Mooncake from a serving engine**", "python")
        script.write_text(code.replace("127.0.0.1:50051", master))
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4 pages loaded back from Mooncake"


def shown_outputs() -> list[tuple[str, str]]:
    """(command, the text right after its block) of each block that shows a `$ ` command."""
    found = []
    for block in re.finditer(
        r"```\n\$ (hicache-pipeline [^\n]*)\n.*?```\n\n?([^\n]*)", README, re.S
    ):
        found.append((block.group(1), block.group(2)))
    return found


def test_every_shown_output_is_produced_by_a_test_or_marked_abridged() -> None:
    """Outputs with timings or rates are examples (abridged); the others are named beside
    their block with the test that produces them."""
    shown = shown_outputs()
    assert len(shown) >= 8
    unmarked = [
        command
        for command, after in shown
        if not re.match(r"\((Abridged|Produced by `tests/[\w/]+\.py`)", after)
    ]
    assert unmarked == []


def produced_blocks() -> list[tuple[str, str]]:
    """(command, output) of each block README says this file produces."""
    pattern = r"```\n\$ (hicache-pipeline [^\n]*)\n((?:(?!```).)*)```\n\n\(Produced by `tests/"
    return [(m.group(1), m.group(2)) for m in re.finditer(pattern, README, re.S)]


def test_the_outputs_readme_shows_are_what_the_commands_print(tmp_path: Path) -> None:
    blocks = produced_blocks()
    assert [c.split()[1] for c, _ in blocks] == [
        "list",
        "explain",
        "explain",
        "plan",
        "validate",
        "check-ordering",
    ]
    for command, shown in blocks:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", *command.split()[1:]],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert done.returncode in (0, 1), done.stderr  # check-ordering: 1 for the deadlock
        assert done.stdout == shown, command
    assert list(tmp_path.iterdir()) == []  # none of them writes a file


def test_the_groups_a_config_may_choose_are_the_schemas_groups() -> None:
    """README's count and list of config groups ("Configs as untrusted input") are the
    schema's (it said "seven" when there were nine)."""
    words = {7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    said = re.search(r"each of the (\w+) groups \(([^)]*)\)", README)
    assert said is not None
    assert said.group(1) == words[len(GROUP_SCHEMAS)]
    assert sorted(re.findall(r"`(\w+)`", said.group(2))) == sorted(GROUP_SCHEMAS)
