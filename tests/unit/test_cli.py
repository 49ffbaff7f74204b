"""The command line as a user meets it: subprocesses, exit codes, JSON on stdout, no litter."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MOONCAKE


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_explain_json_lists_every_rule_and_the_fallback(tmp_path: Path) -> None:
    done = cli(
        "explain",
        "strategy=rotating",
        "topology=h200x8_dp8",
        "topology.nnodes=2",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["strategy"] == "rotating" and verdict["active"] is False
    assert verdict["effective_strategy"] == "replicated"
    failed = {r["name"]: r["message"] for r in verdict["rules"] if not r["passed"]}
    assert set(failed) == {"attn_tp_gt_1", "single_node"}  # both reported, not just the first
    assert "raise topology.tp_size" in failed["attn_tp_gt_1"]
    assert len(verdict["rules"]) == 10
    assert list(tmp_path.iterdir()) == []  # no outputs/ or .hydra folders left behind


def test_strict_explain_and_run_refuse_an_inactive_strategy(tmp_path: Path) -> None:
    args = ("strategy=rotating", "topology=tp1", "strict=true")
    assert cli("explain", *args, cwd=tmp_path).returncode == 1
    run = cli("run", *args, cwd=tmp_path)
    assert run.returncode == 1
    assert "strict: strategy rotating is inactive (attn_tp_gt_1" in run.stderr


def test_normalizations_are_notes(tmp_path: Path) -> None:
    done = cli(
        "explain",
        "topology.io_backend=direct",
        "topology.mem_layout=page_first",
        "--json",
        cwd=tmp_path,
    )
    notes = json.loads(done.stdout)["notes"]
    assert notes == [
        "mem_layout page_first -> page_first_direct: the direct backend copies whole pages"
    ]


def test_plan_sizes_tp8_on_a_laptop(tmp_path: Path) -> None:
    done = cli(
        "plan",
        "strategy=rotating",
        "topology=tp8",
        "model=deepseek_v3",
        "workload.num_tokens=16384",
        "workload.device_tokens=65536",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    ranks = plan["ranks"]
    assert len(ranks) == 8
    total = 16384 * 70272
    assert sum(r["h2d_bytes"] for r in ranks) == total
    assert sum(r["broadcast_send_bytes"] for r in ranks) == total
    assert plan["stages"]["load"]["exchange"] == ["gather", "broadcast", "scatter", "record_event"]
    assert list(tmp_path.iterdir()) == []


def test_run_reports_json_and_bit_exact(tmp_path: Path) -> None:
    done = cli("run", "strategy=rotating", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verified"] is True and result["effective_strategy"] == "rotating"
    assert {
        "rank",
        "d2h_bytes",
        "h2d_bytes",
        "broadcast_send_bytes",
        "broadcast_recv_bytes",
        "host_capacity_tokens",
        "host_pool_bytes",
        "ops",
    } <= set(result["ranks"][0])


@pytest.mark.parametrize("kind", ["file", MOONCAKE])
def test_run_with_a_store_makes_it_and_puts_it_away(kind: str, tmp_path: Path) -> None:
    """A temporary folder, or a master on loopback, for the length of the job (mooncake:
    storage.master=auto); `--json` carries each rank's L3 numbers; nothing is left behind."""
    done = cli("run", f"storage={kind}", "strategy=single_source", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ranks = json.loads(done.stdout)["ranks"]
    assert [r["l3_read_bytes"] > 0 for r in ranks] == [True, False]  # the first rank reads
    assert all(r["l3_hit_pages"] > 0 and r["verified"] for r in ranks)
    assert list(tmp_path.iterdir()) == []
    if kind == "mooncake":  # the job's own master is gone (other tests may run theirs)
        pid = int(re.search(r"mooncake_master \(pid (\d+)\)", done.stderr).group(1))  # type: ignore[union-attr]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_given_master_that_does_not_answer_exits_2_naming_the_key(tmp_path: Path) -> None:
    done = cli(
        "run",
        "storage=mooncake",
        "storage.master=127.0.0.1:9",
        "storage.metadata_server=http://127.0.0.1:9/metadata",
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "storage.master=127.0.0.1:9: nothing answers" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


BAD = {
    "model/typo.yaml": "defaults: [tiny_mla, _self_]\nname: typo\nnum_layrs: 3\n",
    "model/wrongtype.yaml": "defaults: [tiny_mla, _self_]\nname: w\nnum_layers: many\n",
    "model/badenum.yaml": "defaults: [tiny_mla, _self_]\nname: e\nkv_dtype: int3\n",
    "topology/impossible.yaml": "defaults: [tp4, _self_]\nname: i\ndp_size: 3\n"
    "dp_attention: true\n",
    "strategy/evil.yaml": "defaults: [replicated, _self_]\nname: evil\nbackup:\n  finish:\n"
    "    - _target_: os.system\n      command: echo pwned\n",
    "strategy/unbindable.yaml": "defaults: [replicated, _self_]\nname: u\nbackup:\n"
    "  per_step:\n    - _target_: stages.copy.Copy\n      chunk_pages: 4\n",
    "strategy/notastage.yaml": "defaults: [replicated, _self_]\nname: n\nbackup:\n"
    "  per_step:\n    - _target_: stages.copy.Direction\n    - _target_: stages.copy.__class__\n"
    "    - _target_: stages.copy._Dma\n",
    "strategy/wronglist.yaml": "defaults: [replicated, _self_]\nname: w\nbackup:\n"
    "  prepare:\n    - _target_: stages.copy.Copy\n",
    "strategy/badgraphs.yaml": "defaults: [replicated, _self_]\nname: g\ncuda_graph_cache: -1\n",
    "strategy/badknobs.yaml": "defaults: [replicated, _self_]\nname: k\nchunk_pages: -1\n",
    "strategy/badstaging.yaml": "defaults: [replicated, _self_]\nname: s\nstaging_bytes: 0\n",
    "strategy/badverify.yaml": "defaults: [replicated, _self_]\nname: v\nverify_every: -2\n",
    "strategy/badgroups.yaml": "defaults: [replicated, _self_]\nname: l\nload_group_bytes: -1\n",
    "strategy/badskips.yaml": "defaults: [replicated, _self_]\nname: m\n"
    "idle_sync_skip:\n  max_skips: 0\n",
}


def test_validate_lists_every_error_with_file_and_key(tmp_path: Path) -> None:
    for name, text in BAD.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    done = cli("validate", "--config-dir", str(tmp_path), "--json", cwd=tmp_path)
    assert done.returncode == 1
    errors = json.loads(done.stdout)["errors"]
    assert all(set(e) == {"file", "key", "line", "message"} for e in errors)
    expectations = {
        "model/typo.yaml": "num_layrs",
        "model/wrongtype.yaml": "many",
        "model/badenum.yaml": "int3",
        "topology/impossible.yaml": "dp_size=3 must divide topology.tp_size=4",
        "strategy/evil.yaml": "'os.system' lies outside the 'stages' package",
        "strategy/unbindable.yaml": "strategy.backup.per_step[0]: arguments ['chunk_pages']",
        "strategy/notastage.yaml": "'stages.copy.Direction' does not name a class defined in",
        "strategy/wronglist.yaml": "stages.copy.Copy' is not a stage for the prepare list",
        "strategy/badgraphs.yaml": "strategy.cuda_graph_cache=-1 must be >= 0",
        "strategy/badknobs.yaml": "strategy.chunk_pages=-1 must be >= 0",
        "strategy/badstaging.yaml": "strategy.staging_bytes=0 must be >= 1",
        "strategy/badverify.yaml": "strategy.verify_every=-2 must be >= 0",
        "strategy/badgroups.yaml": "strategy.load_group_bytes=-1 must be >= 0",
        "strategy/badskips.yaml": "strategy.idle_sync_skip.max_skips=0 must be >= 1",
    }
    for name, fragment in expectations.items():
        assert any(e["file"].endswith(name) and fragment in e["message"] for e in errors), (
            name,
            errors,
        )
    not_stages = [e for e in errors if e["file"].endswith("notastage.yaml")]
    assert [e["key"] for e in not_stages] == [f"strategy.backup.per_step[{i}]" for i in range(3)]
    assert [e["line"] for e in not_stages] == [5, 6, 7]  # every bad entry, each at its line
    (knob,) = [e for e in errors if e["file"].endswith("badknobs.yaml")]
    assert (knob["key"], knob["line"]) == ("strategy.chunk_pages", 3)


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_help(args: list[str], tmp_path: Path) -> None:
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 0
    assert "hicache-pipeline" in done.stdout and "strategy" in done.stdout


def test_unknown_key_fails_before_anything_runs(tmp_path: Path) -> None:
    done = cli("run", "+strategy.chunk_page=4", cwd=tmp_path)
    assert done.returncode == 2  # a config mistake
    assert "strategy.chunk_page: not a field of StrategyConfig" in done.stderr


@pytest.mark.distributed
def test_run_joins_a_torchrun_launch(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "pipeline",
            "run",
            "strategy=rotating",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)  # rank 0 alone prints: one JSON document
    assert result["verified"] is True and [r["rank"] for r in result["ranks"]] == [0, 1]


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """A subcommand run in this process (help, list, refusals: nothing starts a rank)."""
    from pipeline.cli import COMMANDS, run_command

    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_each_subcommand_and_each_says_its_own(capsys: pytest.CaptureFixture) -> None:
    from pipeline.cli import COMMANDS, main

    main(["--help"])
    usage = capsys.readouterr().out
    listed = [
        line.split()[0] for line in usage.split("subcommands:\n")[1].split("\n\n")[0].splitlines()
    ]
    assert listed == list(COMMANDS)
    texts = set()
    for name in COMMANDS:
        code, out, _ = in_process(capsys, name, "--help")
        assert code == 0 and out.startswith(f"usage: hicache-pipeline {name} ")
        assert "example:\n  hicache-pipeline " in out and "key knobs:" in out
        texts.add(out)
    assert len(texts) == len(COMMANDS)


def test_version_is_the_installed_one() -> None:
    from importlib.metadata import version

    done = cli("--version")
    assert (
        done.returncode == 0
        and done.stdout.strip() == f"hicache-pipeline {version('hicache-pipeline')}"
    )


def test_list_shows_every_option_with_a_description_and_never_a_schema(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "mine.yaml").write_text(
        "# My rotating variant.\ndefaults:\n  - rotating\n  - _self_\nchunk_pages: 4\n"
    )
    code, out, _ = in_process(capsys, "list", "--json", "--config-dir", str(tmp_path))
    assert code == 0
    groups = json.loads(out)["groups"]
    assert set(groups) >= {"model", "topology", "strategy", "workload", "storage", "bench"}
    names = {g: [o["name"] for o in options] for g, options in groups.items()}
    assert not any(n.startswith("base_") for found in names.values() for n in found)
    assert all(o["description"] for options in groups.values() for o in options)
    defaults = {g: [o["name"] for o in options if o["default"]] for g, options in groups.items()}
    assert defaults["strategy"] == ["replicated"] and defaults["topology"] == ["tp2"]
    mine = next(o for o in groups["strategy"] if o["name"] == "mine")
    assert mine == {
        "name": "mine",
        "description": "My rotating variant",
        "default": False,
        "source": "user",
    }
    code, out, _ = in_process(capsys, "list")
    assert "  * replicated" in out and "mine" not in out


@pytest.mark.parametrize("command", ["plan", "check-ordering", "simulate", "soak", "run"])
def test_strict_refuses_a_fallback_in_every_command_that_resolves_a_strategy(
    capsys: pytest.CaptureFixture, command: str
) -> None:
    code, out, err = in_process(capsys, command, "strategy=rotating", "topology=tp1", "strict=true")
    assert code == 1 and out == ""
    assert "strict: strategy rotating is inactive (attn_tp_gt_1" in err


def test_headings_and_cfg_job_say_what_runs(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = in_process(
        capsys, "plan", "topology=tp8", "topology.dp_size=2", "topology.dp_attention=true"
    )
    assert code == 0 and "on tp8 dp2 (preset tp8)" in out.splitlines()[1]
    code, out, _ = in_process(capsys, "explain", "topology=h200x8_dp8")
    assert "on tp8 dp8 (preset h200x8_dp8)" in out
    code, out, _ = in_process(capsys, "run", "strategy=rotating", "topology=tp1", "--cfg", "job")
    assert code == 0
    assert out.startswith("# strategy rotating is inactive here: replicated runs\n")
    assert "\nstrategy:\n  name: replicated\n" in out


def test_a_sweep_runs_every_job_reports_each_and_writes_nothing(tmp_path: Path) -> None:
    args = ("plan", "-m", "strategy=rotating,replicated", "topology=tp1,tp2", "strict=true")
    done = cli(*args, "--json", cwd=tmp_path)
    assert done.returncode == 1  # the worst job: rotating on tp1 is refused under strict
    jobs = [json.loads(line) for line in done.stdout.splitlines()]  # JSON Lines
    assert [j["overrides"][:2] for j in jobs] == [
        ["strategy=rotating", "topology=tp1"],
        ["strategy=rotating", "topology=tp2"],
        ["strategy=replicated", "topology=tp1"],
        ["strategy=replicated", "topology=tp2"],
    ]
    assert [j["verdict"] for j in jobs] == ["failed", "ok", "ok", "ok"]
    assert "strict: strategy rotating is inactive" in jobs[0]["why"]
    assert jobs[1]["result"]["effective_strategy"] == "rotating"
    table = cli(*args, cwd=tmp_path)
    rows = [
        line for line in table.stdout.splitlines() if line.startswith("| ") and "job" not in line
    ]
    assert len(rows) == 5 and "failed: strict" in rows[1] and "| ok |" in rows[2]
    assert list(tmp_path.iterdir()) == []  # no multirun/ or outputs/ folder


def test_a_sweep_too_large_or_unparsable_is_a_config_error() -> None:
    done = cli("explain", "-m", "workload.num_tokens=range(1,1000)")
    assert done.returncode == 2 and "a sweep of more than 256 jobs: at most 256" in done.stderr


def test_a_sweep_shows_progress_on_a_terminal_and_keeps_json_clean(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal (100 columns) shows a bar with a rate; stdout stays JSON."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    args = ("explain", "-m", "strategy=replicated,rotating", "topology=tp1,tp2", "--json")
    with subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE, stderr=follower
    ) as proc:
        os.close(follower)
        out, _ = proc.communicate(timeout=120)
    said = b""
    with contextlib.suppress(OSError):  # the terminal's other end is closed once read out
        while chunk := os.read(leader, 4096):
            said += chunk
    os.close(leader)
    assert b"sweep jobs:" in said and b"it/s]" in said  # a bar with a rate (and an ETA)
    assert len([json.loads(line) for line in out.decode().splitlines()]) == 4
    piped = cli("explain", "-m", "strategy=replicated,rotating", "--json")
    assert "sweep jobs" not in piped.stderr  # not a terminal: no bar in logs


@pytest.mark.distributed
def test_rotating_runs_on_8_cpu_ranks_once_the_tiny_model_has_a_layer_each(
    capsys: pytest.CaptureFixture,
) -> None:
    _, out, _ = in_process(capsys, "explain", "strategy=rotating", "topology=tp8")
    assert "model.num_layers=8" in out and "INACTIVE" in out  # the fallback says what to do
    done = cli("run", "strategy=rotating", "topology=tp8", "model.num_layers=8", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["effective_strategy"] == "rotating" and len(result["ranks"]) == 8


def test_a_schema_is_never_an_option(capsys: pytest.CaptureFixture) -> None:
    code, _, err = in_process(capsys, "run", "model=base_model")
    assert code == 2 and "the group's schema, not an option" in err


def test_without_matplotlib_the_bench_says_which_extra_draws_its_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.jobs.bench.output import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    said = plot({"rows": []}, tmp_path / "bench.png")
    assert 'pip install -e ".[plot]"' in said and not (tmp_path / "bench.png").exists()
