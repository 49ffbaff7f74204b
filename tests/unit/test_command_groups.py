"""Each command checks the config groups it reads, and no other: `plan` of a topology whose
page multiple the bench's sizes miss plans, `bench` of it says why it cannot; and every
command that composes a job takes every shipped topology with every shipped model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli.main import COMMANDS, run_command
from pipeline.config.app import configs
from pipeline.config.compose import READS
from pipeline.config.validate import checked_config
from pipeline.core.checks import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"
DCP = ("topology=tp8_dcp4", "model=deepseek_v3")
"""A shipped topology and model that the shipped bench's smallest size (64 tokens, one page)
cannot use: with decode context parallel 4 a transfer moves whole pages on every rank."""


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["plan", "explain", "check-ordering"])
def test_a_command_that_reads_no_bench_group_never_refuses_its_sizes(
    capsys: pytest.CaptureFixture, command: str
) -> None:
    code, out, err = in_process(capsys, command, *DCP)
    assert code == 0, err
    assert "bench.sizes" not in out + err


@pytest.mark.parametrize("command", ["run", "simulate", "soak"])
def test_the_commands_that_start_ranks_check_no_group_they_do_not_read(command: str) -> None:
    with configs(None) as found:
        session, problems = checked_config([*DCP], found, READS[command])
        assert problems == [] and session is not None
        job = session.job(READS[command])
    assert (job.topology.dcp_size, job.model.name) == (4, "deepseek_v3")


def test_bench_refuses_the_sizes_it_cannot_move_saying_why(capsys: pytest.CaptureFixture) -> None:
    code, out, err = in_process(capsys, "bench", *DCP, "topology.device=cpu")
    assert code == 2 and out == ""
    assert "bench.sizes [64] must each be a multiple of page_size x dcp_size = 256" in err


def test_validate_of_the_combination_says_only_bench_reads_what_it_refuses(
    capsys: pytest.CaptureFixture,
) -> None:
    code, out, _ = in_process(capsys, "validate", *DCP)
    assert code == 1
    assert "bench.sizes [64] must each be a multiple" in out
    assert "only `bench` reads bench.*: run, plan, explain and the rest take this config" in out


@pytest.fixture(scope="module")
def loaded() -> Iterator[object]:
    with configs(None) as found:
        yield found


BENCH_MISSES = {"deepseek_v3", "deepseek_v32", "deepseek_v3_fp8", "glm5"}
"""The shipped models of 64-token pages: under dcp 4 a transfer is a multiple of 256."""


@pytest.mark.parametrize("topology", options("topology"))
def test_every_command_takes_every_shipped_topology_with_every_shipped_model(
    topology: str, loaded: object
) -> None:
    for model in options("model"):
        overrides = [f"topology={topology}", f"model={model}"]
        session, _ = checked_config(overrides, loaded)  # type: ignore[arg-type]
        assert session is not None, overrides
        for command, reads in READS.items():
            if command in ("validate", "list"):
                continue
            try:
                session.job(reads)
            except ConfigError as e:
                expected = command == "bench" and topology == "tp8_dcp4" and model in BENCH_MISSES
                assert expected, (command, overrides, e.problems)
                ((problem),) = e.problems
                assert problem.key == "bench.sizes" and "page_size x dcp_size" in problem.message
