"""The command line's manners: a closed pipe ends quietly, `--json` is always JSON, `list`
refuses what it would ignore, a bare invocation is a usage error, and a spawned run leaves no
warning behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.cli import COMMANDS, main, run_command
from pipeline.jobs.report import validate_text


def into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """A subcommand whose stdout's reader has gone already (as `| head -1` leaves it)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "pipeline", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [["list", "--json"], ["explain", "-m", "strategy=replicated,rotating", "--json"]],
    ids=["list", "sweep"],
)
def test_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    done = into_a_closed_pipe(*args)
    assert done.returncode == 141  # 128 + SIGPIPE, as a process SIGPIPE ended
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr


def test_a_bare_invocation_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as ended:
        main([])
    out, err = capsys.readouterr()
    assert ended.value.code == 2 and out == ""
    assert err.startswith("usage: hicache-pipeline SUBCOMMAND")


def json_of(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["plan", "strategy.chunk_page=8"], 2, "did you mean strategy.chunk_pages?"),
        (["explain", "--bogus"], 2, "--bogus: not an option of this command"),
        (["plan", "strategy=rotating", "topology=tp1", "strict=true"], 1, "strict: strategy"),
        (["list", "strategy=rotating"], 2, "list shows every option and takes no overrides"),
    ],
    ids=["config", "flag", "strict", "list"],
)
def test_json_is_json_when_a_command_fails(
    capsys: pytest.CaptureFixture, args: list[str], code: int, said: str
) -> None:
    got, result = json_of(capsys, *args, "--json")
    assert got == code and result["exit_code"] == code and said in result["error"]
    assert all(set(e) == {"file", "key", "line", "message"} for e in result["errors"])


def test_cfg_job_with_json_is_the_config_as_json(capsys: pytest.CaptureFixture) -> None:
    code, result = json_of(
        capsys, "run", "strategy=rotating", "topology=tp1", "--cfg", "job", "--json"
    )
    assert code == 0
    assert result["note"] == "strategy rotating is inactive here: replicated runs"
    assert result["config"]["strategy"]["name"] == "replicated"
    assert result["config"]["model"]["kv_dtype"] == "bf16"


def test_list_refuses_overrides_it_would_ignore(capsys: pytest.CaptureFixture) -> None:
    code = run_command(COMMANDS["list"], ["strategy=rotating"], "list")
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "list shows every option and takes no overrides (got strategy=rotating)" in err


def test_a_spawned_run_leaves_no_leaked_semaphore_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "topology=tp1"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "leaked semaphore" not in done.stderr


def test_validate_counts_one_config_and_one_error_in_the_singular() -> None:
    one = {"file": "overrides", "line": None, "message": "x"}
    assert (
        validate_text({"checked": ["a"], "errors": [], "warnings": [], "valid": True})
        == "checked 1 config\nvalid"
    )
    text = validate_text({"checked": ["a", "b"], "errors": [one], "warnings": [], "valid": False})
    assert text.startswith("checked 2 configs\n") and text.endswith("\n1 error")
