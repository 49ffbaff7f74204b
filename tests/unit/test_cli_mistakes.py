"""Config mistakes as a user makes them: every one reported in one run, each naming the file or
override that holds it and the fix, in the project's own words (never Hydra's or OmegaConf's
unless --verbose asks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.core.checks import ConfigError

HYDRA_WORDS = (
    "full_key",
    "reference_type",
    "object_type",
    "To append to your config",
    "Could not override",
    "Config search path",
    "missing mandatory value",
    "Structured config",
    "base_strategy",
)
"""What Hydra and OmegaConf say that a user must never see without --verbose."""

MISTAKES = {
    # a file that extends the schema only: its refused kv_dtype is then unset, which must not
    # read as a second mistake ("missing mandatory value")
    "model/mine.yaml": "defaults: [base_model, _self_]\nname: mine\nkind: mla\n"
    "num_layers: 0\nkv_row_bytes: 64\nkv_dtype: bf17\npage_sise: 4\npage_size: 4\n",
    "workload/mine.yaml": "defaults: [default, _self_]\nnum_tokens: 255\ncycles: many\n"
    "host_ratio: -1\n",
    "strategy/mine.yaml": "defaults: [replicated, _self_]\nname: mine\nchunk_pages: -1\n"
    "backup:\n  finish:\n    - _target_: os.system\n",
}
EXPECTED = [  # (file, key, line, what the message says)
    ("model/mine.yaml", "model.num_layers", 4, "model.num_layers=0 must be a positive integer"),
    ("model/mine.yaml", "model.kv_dtype", 6, "not one of ['bf16', 'fp16', 'fp4', 'fp8']"),
    ("model/mine.yaml", "model.page_sise", 7, "did you mean model.page_size?"),
    ("workload/mine.yaml", "workload.num_tokens", 2, "must be a multiple of page_size"),
    ("workload/mine.yaml", "workload.cycles", 3, "workload.cycles='many' is not an int"),
    ("workload/mine.yaml", "workload.host_ratio", 4, "workload.host_ratio=-1.0 must be > 0"),
    ("strategy/mine.yaml", "strategy.chunk_pages", 3, "strategy.chunk_pages=-1 must be >= 0"),
    ("strategy/mine.yaml", "strategy.backup.finish[0]", 6, "lies outside the 'stages' package"),
    ("overrides", "runtime.timeout_s", None, "runtime.timeout_s=0.0 must be > 0"),
    ("overrides", "stratgy", None, "did you mean strategy?"),
]
CHOSEN = ["model=mine", "workload=mine", "strategy=mine", "runtime.timeout_s=0", "stratgy=x"]


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from pipeline.cli import COMMANDS, run_command

    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def user_folder(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


def test_validate_reports_ten_mistakes_of_a_users_config_in_one_run(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """Schema, enum, range and cross-group mistakes of three files and two overrides: all in
    one run, each at its file (and line) or override, none twice, no Hydra words."""
    folder = user_folder(tmp_path, MISTAKES)
    code, out, err = in_process(capsys, "validate", "--config-dir", folder, *CHOSEN, "--json")
    assert code == 1, err
    errors = json.loads(out)["errors"]
    for file, key, line, fragment in EXPECTED:
        found = [e for e in errors if e["file"].endswith(file) and e["key"] == key]
        assert len(found) == 1 and fragment in found[0]["message"], (key, errors)
        assert found[0]["line"] == line, found
    assert len(errors) == len(EXPECTED), errors
    assert not any(word in out + err for word in HYDRA_WORDS)


@pytest.mark.parametrize("command", ["run", "explain", "plan"])
def test_the_commands_that_compose_report_the_same_mistakes_at_once(
    capsys: pytest.CaptureFixture, tmp_path: Path, command: str
) -> None:
    folder = user_folder(tmp_path, MISTAKES)
    code, out, err = in_process(capsys, command, "--config-dir", folder, *CHOSEN)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1  # one line, every problem on it
    for file, key, _, fragment in EXPECTED:
        assert fragment in err and key in err and file in err, (key, err)
    assert not any(word in err for word in HYDRA_WORDS)


def test_the_librarys_compose_raises_every_mistake(tmp_path: Path) -> None:
    import pipeline

    folder = user_folder(tmp_path, MISTAKES)
    with pytest.raises(ConfigError) as caught:
        pipeline.compose(CHOSEN, config_dir=folder)
    found = {(Path(p.file or "").name, p.key) for p in caught.value.problems}
    assert found == {(Path(file).name, key) for file, key, _, _ in EXPECTED}


def errors_of(capsys: pytest.CaptureFixture, *overrides: str) -> list[dict]:
    code, out, err = in_process(capsys, "validate", *overrides, "--json")
    assert code == 1
    assert not any(word in out + err for word in HYDRA_WORDS), out
    return json.loads(out)["errors"]


def test_an_unknown_key_lists_the_known_ones_and_the_closest(capsys: pytest.CaptureFixture) -> None:
    (error,) = errors_of(capsys, "strategy.chunk_page=8")
    assert (error["file"], error["key"]) == ("overrides", "strategy.chunk_page")
    assert "not a field of StrategyConfig (known: name, ownership, " in error["message"]
    assert error["message"].endswith("did you mean strategy.chunk_pages?")


def test_an_unknown_option_lists_the_real_ones_and_the_closest(
    capsys: pytest.CaptureFixture,
) -> None:
    (error,) = errors_of(capsys, "strategy=rotatingg")
    assert (error["file"], error["key"]) == ("overrides", "strategy")
    message = error["message"]
    assert "(options: auto, replicated, rotating, single_source;" in message
    assert message.endswith("did you mean rotating?") and "base_" not in message


def test_an_unknown_group_gets_a_did_you_mean(capsys: pytest.CaptureFixture) -> None:
    (error,) = errors_of(capsys, "stratgy=rotating")
    assert error["key"] == "stratgy" and "no config group or key 'stratgy'" in error["message"]
    assert error["message"].endswith("did you mean strategy?")


def test_a_wrong_enum_value_names_the_allowed_ones(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    (error,) = errors_of(capsys, "model.kv_dtype=bf17")
    assert error["message"] == (
        "model.kv_dtype='bf17' is not one of ['bf16', 'fp16', 'fp4', 'fp8']; did you mean bf16?"
    )
    own = MISTAKES["model/mine.yaml"].replace("num_layers: 0", "num_layers: 2")
    alone = {"model/own.yaml": own}
    folder = user_folder(tmp_path, alone)
    code, out, _ = in_process(capsys, "validate", "--config-dir", folder, "--json")
    messages = [e["message"] for e in json.loads(out)["errors"]]
    assert code == 1 and len(messages) == 2  # kv_dtype and page_sise, nothing "missing"
    assert any("is not one of ['bf16', 'fp16', 'fp4', 'fp8']" in m for m in messages)


def test_a_range_mistake_in_an_override_is_blamed_on_the_override(
    capsys: pytest.CaptureFixture,
) -> None:
    (error,) = errors_of(capsys, "strategy.chunk_pages=-1")
    assert error == {
        "file": "overrides",
        "key": "strategy.chunk_pages",
        "line": None,
        "message": "strategy.chunk_pages=-1 must be >= 0",
    }


def test_hydras_own_words_only_with_verbose(capsys: pytest.CaptureFixture) -> None:
    code, _, err = in_process(capsys, "plan", "+strategy.chunk_pages=3")
    assert code == 2
    assert "+strategy.chunk_pages: strategy.chunk_pages is set already: drop the '+'" in err
    assert "Could not append" not in err
    said = subprocess.run(
        [sys.executable, "-m", "pipeline", "plan", "+strategy.chunk_pages=3", "--verbose"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert said.returncode == 2 and "Hydra said: Could not append to config" in said.stderr
