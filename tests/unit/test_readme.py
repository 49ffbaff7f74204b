"""What the docs claim that the generic checks of test_doc_pages.py cannot run: the Mooncake
block for library users (docs/l3.md) runs as written against a master started the way the
page says (the project's own flags), and README's count of config groups is the schema's."""

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
L3_PAGE = (ROOT / "docs/l3.md").read_text()


def block_after(heading: str, fence: str) -> str:
    section = L3_PAGE[L3_PAGE.index(heading) :]
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


def test_the_groups_a_config_may_choose_are_the_schemas_groups() -> None:
    """README's count and list of config groups are the schema's (it once said "seven" when
    there were nine)."""
    words = {7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    said = re.search(r"each of (\w+) groups \(([^)]*)\)", README)
    assert said is not None
    assert said.group(1) == words[len(GROUP_SCHEMAS)]
    assert sorted(re.findall(r"`(\w+)`", said.group(2))) == sorted(GROUP_SCHEMAS)
