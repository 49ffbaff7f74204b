"""A `config.yaml` in `--config-dir` sets a deployment's defaults as a Hydra primary config
does (a defaults list choosing options, then plain knobs), under the command line, which
still wins; validate checks it as it checks every file of the folder (it was refused, with no
hint of what the folder takes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pipeline
from pipeline.cli.main import COMMANDS, run_command
from pipeline.core.checks import ConfigError

DEPLOYMENT = """\
# our cluster: rotating with 16-page backup chunks, on our pair of CPU ranks
defaults:
  - strategy: prod
  - topology: pair
  - _self_
workload:
  num_tokens: 64
"""
FOLDER = {
    "strategy/prod.yaml": "defaults: [rotating, _self_]\nname: prod\nchunk_pages: 16\n",
    "topology/pair.yaml": "defaults: [tp2, _self_]\nname: pair\ndevice: cpu\n",
    "config.yaml": DEPLOYMENT,
}


def user_folder(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_and_explain_take_the_deployments_choices_and_knobs(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    folder = user_folder(tmp_path, FOLDER)
    code, out, err = in_process(capsys, "plan", "--config-dir", folder, "--json")
    assert code == 0, err
    planned = json.loads(out)
    assert (planned["strategy"], planned["effective_strategy"]) == ("prod", "prod")
    assert (planned["topology"], planned["num_tokens"]) == ("pair", 64)
    code, out, err = in_process(capsys, "explain", "--config-dir", folder)
    assert code == 0, err
    assert out.startswith("strategy prod: ACTIVE for tiny_mla on tp2 (preset pair)")
    job = pipeline.compose(config_dir=folder)
    assert job.strategy.config.chunk_pages == 16 and job.workload.num_tokens == 64


def test_the_command_line_wins_over_the_deployment(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    folder = user_folder(tmp_path, FOLDER)
    args = ("strategy=replicated", "topology=tp1", "workload.num_tokens=128", "--json")
    code, out, err = in_process(capsys, "plan", "--config-dir", folder, *args)
    assert code == 0, err
    planned = json.loads(out)
    assert (planned["strategy"], planned["topology"], planned["num_tokens"]) == (
        "replicated",
        "tp1",
        128,
    )


@pytest.mark.distributed
def test_run_takes_the_deployment(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    folder = user_folder(tmp_path, FOLDER)
    code, out, err = in_process(capsys, "run", "--config-dir", folder, "--json")
    assert code == 0, err
    ran = json.loads(out)
    assert (ran["strategy"], ran["effective_strategy"], ran["topology"]) == ("prod", "prod", "pair")
    assert ran["verified"] and ran["device"] == "cpu"
    # rank 0 owns layers 0, 2 and 4 of tiny_mla: 64 tokens of 64 B rows, in each of 2 cycles
    assert ran["ranks"][0]["d2h_bytes"] == 2 * 3 * 64 * 64


def test_validate_checks_the_deployment_like_every_file(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    folder = user_folder(tmp_path, FOLDER)
    code, out, err = in_process(capsys, "validate", "--config-dir", folder, "--json")
    assert code == 0, out + err
    assert str(tmp_path / "config.yaml") in json.loads(out)["checked"]


MISTAKES = {
    "defaults:\n  - strategy: prdo\n  - _self_\n": (
        2,
        "defaults: strategy=prdo is no option of the strategy group (options: auto, prod, "
        "replicated, rotating, single_source)",
    ),
    "defaults:\n  - stratgy: prod\n": (2, "defaults: stratgy is no config group"),
    "workload:\n  num_tokens: many\n": (2, "workload.num_tokens='many' is not an int"),
    "workload: &w\n  num_tokens: 64\n": (1, "YAML anchors are not allowed"),
    "hydra:\n  run: {dir: x}\n": (1, "hydra: not a key of a deployment's config.yaml"),
    "storage:\n  kind: mooncake\n  master: 10.0.0.1:50051\n": (
        3,
        "storage.master may not be set in a config file",
    ),
}


@pytest.mark.parametrize("text", MISTAKES)
def test_each_mistake_of_the_deployment_is_one_line_at_its_line(
    capsys: pytest.CaptureFixture, tmp_path: Path, text: str
) -> None:
    folder = user_folder(tmp_path, {**FOLDER, "config.yaml": text})
    line, fragment = MISTAKES[text]
    code, out, _ = in_process(capsys, "validate", "--config-dir", folder, "--json")
    assert code == 1
    (error,) = json.loads(out)["errors"]
    assert error["file"] == str(tmp_path / "config.yaml") and error["line"] == line
    assert fragment in error["message"], error
    code, out, err = in_process(capsys, "plan", "--config-dir", folder)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert fragment in err
    with pytest.raises(ConfigError, match=r"config\.yaml"):
        pipeline.compose(config_dir=folder)
