"""`validate` warns, without failing, of a page so small that one long prefix makes more than
100K store objects (`model.page_size=1` was silent, then `plan` showed 131,072 of them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli.main import COMMANDS, run_command

WARNING = (
    "model.page_size=1 makes 131072 store objects per prefix of 131072 tokens (one per page): "
    "a store writes, lists and checks each one; raise model.page_size (64 makes 2048)"
)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_tiny_page_is_a_warning_that_names_the_knob_and_the_count(
    capsys: pytest.CaptureFixture,
) -> None:
    code, out, err = in_process(capsys, "validate", "model.page_size=1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["valid"] and result["errors"] == []
    (warning,) = result["warnings"]
    assert (warning["key"], warning["file"], warning["message"]) == (
        "model.page_size",
        "overrides",
        WARNING,
    )
    code, out, _ = in_process(capsys, "validate", "model.page_size=1")
    assert code == 0 and f"warning: overrides: {WARNING}\n" in out and out.endswith("valid\n")


def test_a_page_of_two_tokens_is_not_warned(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = in_process(capsys, "validate", "model.page_size=2", "--json")
    assert code == 0 and json.loads(out)["warnings"] == []


def test_a_users_model_file_is_warned_at_its_line(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "fine.yaml").write_text(
        "defaults: [tiny_mla, _self_]\nname: fine\npage_size: 1\n"
    )
    code, out, err = in_process(capsys, "validate", "--config-dir", str(tmp_path), "--json")
    assert code == 0, out + err
    (warning,) = json.loads(out)["warnings"]
    assert warning["file"].endswith("model/fine.yaml") and warning["line"] == 3
    assert warning["message"] == WARNING
