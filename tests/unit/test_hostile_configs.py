"""Configs as untrusted input: every attempt below is refused with one line, before anything
runs. Nothing executes (no marker file appears), no file is touched, no rank starts, and no
secret from the environment reaches the output, under validate, explain, plan and run.

The CLI runs in-process (`run_command`), so a case costs a config composition, not a Python
start; `test_cli.py` covers the same door through real subprocesses.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import job_config

import pipeline
from pipeline.cli import COMMANDS, run_command
from pipeline.config.ranges import WEEK_S
from pipeline.jobs.outputs import write_output
from pipeline.jobs.resources import RANKS_PER_CORE

SECRET = "s3cr3t-token-9f2c"
COMMANDS_TRIED = ("validate", "explain", "plan", "run")


class Touch:
    """A pickle that would create `path` if anything ever loaded it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A victim file with known contents, a marker nothing may create, a config folder, and a
    secret in the environment."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    monkeypatch.setenv("SECRET", SECRET)
    monkeypatch.chdir(tmp_path)
    return {"victim": victim, "marker": tmp_path / "marker", "dir": tmp_path / "conf"}


def attempt(command: str, args: list[str], capsys, caplog) -> tuple[int, str, str]:
    caplog.clear()
    environment = dict(os.environ)
    with caplog.at_level(logging.INFO, logger="hicache-pipeline"):
        code = run_command(COMMANDS[command], args)
    assert dict(os.environ) == environment  # no environment changed
    out, err = capsys.readouterr()
    return code, out, err + caplog.text


def refused(command: str, args: list[str], world: dict[str, Path], capsys, caplog) -> str:
    """Run the attempt and check everything a refusal promises; return what it said."""
    code, out, err = attempt(command, args, capsys, caplog)
    said = out + err
    if command == "validate":
        assert code == 1 and "error:" in said, said
    else:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert "starting" not in said  # no rank process was started
    assert not world["marker"].exists()  # nothing executed
    assert world["victim"].read_text() == "precious\n"  # nothing touched
    assert SECRET not in said  # no secret printed
    assert not (world["victim"].parent / "outputs").exists()
    return said


def write(world: dict[str, Path], name: str, text: str) -> list[str]:
    path = world["dir"] / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return ["--config-dir", str(world["dir"])]


def payload(world: dict[str, Path]) -> str:
    return base64.b64encode(pickle.dumps(Touch(world["marker"]))).decode()


OVERRIDE_ATTACKS = {
    "callback_opens_a_file": [
        "+hydra.callbacks.x._target_=builtins.open",
        "+hydra.callbacks.x.file={victim}",
        "+hydra.callbacks.x.mode=w",
    ],
    "callback_copies_over_a_file": [
        "+hydra.callbacks.x._target_=shutil.copyfile",
        "+hydra.callbacks.x.src=/dev/null",
        "+hydra.callbacks.x.dst={victim}",
    ],
    "env_set_pythonpath": ["+hydra.job.env_set.PYTHONPATH={dir}"],
    "logging_group": ["hydra/job_logging=disabled"],
    "run_dir": ["hydra.run.dir={dir}/run"],
    "verbose": ["hydra.verbose=true"],
    "env_resolver": ["model.name=${{oc.env:SECRET}}"],
    "quoted_env_resolver": ["model.name='${{oc.env:SECRET}}'"],
    "decode_resolver": ["strict=${{oc.decode:true}}"],
    "sweep": ["strategy=replicated,rotating"],
    "unknown_root": ["+evil.key=1"],
}


@pytest.mark.parametrize("command", COMMANDS_TRIED)
@pytest.mark.parametrize("attack", list(OVERRIDE_ATTACKS))
def test_overrides_cannot_reach_hydra_resolvers_or_sweeps(attack, command, world, capsys, caplog):
    sitecustomize = world["dir"] / "sitecustomize.py"  # would run in every rank if on its path
    sitecustomize.parent.mkdir(parents=True, exist_ok=True)
    sitecustomize.write_text(f"open({str(world['marker'])!r}, 'w')\n")
    args = [a.format(victim=world["victim"], dir=world["dir"]) for a in OVERRIDE_ATTACKS[attack]]
    said = refused(command, args, world, capsys, caplog)
    assert "overrides" in said


FILE_ATTACKS = {
    "global_package_callbacks": (
        "strategy/evil.yaml",
        "# @package _global_\nhydra:\n  callbacks:\n    x:\n      _target_: torch.load\n"
        "      f: !!binary {payload}\n      weights_only: false\n",
        "@package header",
    ),
    "python_tag": (
        "model/evil.yaml",
        "defaults: [tiny_mla, _self_]\nname: !!python/object/apply:os.system ['touch {marker}']\n",
        "YAML tags are not allowed",
    ),
    "alias_bomb": (
        "model/evil.yaml",
        'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n'
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
        "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
        "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n",
        "YAML anchors are not allowed",
    ),
    "oversized": ("model/evil.yaml", "name: big\n" + "# padding\n" * 8000, "larger than"),
    "env_resolver": (
        "model/evil.yaml",
        "defaults: [tiny_mla, _self_]\nname: ${{oc.env:SECRET}}\n",
        "calls a resolver",
    ),
    "hydra_key": (
        "strategy/evil.yaml",
        "defaults: [replicated, _self_]\nname: evil\nhydra:\n  job:\n    env_set:\n"
        "      PYTHONPATH: {dir}\n",
        "hydra.* may not be set",
    ),
    "logging_file_handler": (
        "hydra/job_logging/evil.yaml",
        "version: 1\nhandlers:\n  f:\n    class: logging.FileHandler\n    filename: {victim}\n"
        "    mode: w\nroot:\n  handlers: [f]\n",
        "not an option of a config group",
    ),
    "primary_config": (
        "config.yaml",
        "defaults: [base_config]\n",
        "defaults: each entry is GROUP: OPTION, or _self_",
    ),
    "defaults_reach_hydra": (
        "strategy/evil.yaml",
        "defaults:\n  - replicated\n  - override /hydra/job_logging: evil\n  - _self_\nname: e\n",
        "may list only options of the strategy group",
    ),
    "shadows_shipped": (
        "strategy/rotating.yaml",
        "defaults: [replicated, _self_]\nname: rotating\n",
        "shadows the shipped option strategy/rotating",
    ),
    "foreign_target": (
        "strategy/evil.yaml",
        "defaults: [replicated, _self_]\nname: evil\nbackup:\n  finish:\n"
        "    - _target_: builtins.eval\n      source: open('{marker}', 'w')\n",
        "lies outside the 'stages' package",
    ),
    "nested_target_argument": (
        "strategy/evil.yaml",
        "defaults: [replicated, _self_]\nname: evil\nload:\n  finish:\n"
        "    - _target_: stages.verify.Verify\n      every:\n        _target_: os.getcwd\n",
        "do not fit stages.verify.Verify",
    ),
    "syntax_error": ("model/evil.yaml", "name: [unclosed\n", "YAML syntax error"),
}


FILE_CASES = [
    (attack, command)
    for i, attack in enumerate(FILE_ATTACKS)
    for command in ("run", COMMANDS_TRIED[i % 3])
]
"""Each attack under `run` (the door to the ranks) and under one of validate, explain and
plan in turn (every command reads a config folder through the same reader); the rest of the
grid runs with -m slow (validate checks every shipped option too: seconds a case)."""


@pytest.mark.parametrize(("attack", "command"), FILE_CASES)
def test_config_files_are_read_as_plain_checked_data(attack, command, world, capsys, caplog):
    check_file_attack(attack, command, world, capsys, caplog)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("attack", "command"),
    [(a, c) for a in FILE_ATTACKS for c in COMMANDS_TRIED if (a, c) not in FILE_CASES],
)
def test_config_files_are_read_as_plain_checked_data_by_every_command(
    attack, command, world, capsys, caplog
):
    check_file_attack(attack, command, world, capsys, caplog)


def check_file_attack(attack, command, world, capsys, caplog) -> None:
    name, text, expected = FILE_ATTACKS[attack]
    fields = {"payload": payload(world), **{k: str(v) for k, v in world.items()}}
    args = write(world, name, text.format(**fields))
    group, option = name.split("/")[0], Path(name).stem
    if command != "validate" and group in ("model", "strategy"):
        args.append(f"{group}={option}")
    said = refused(command, args, world, capsys, caplog)
    assert expected in said, said  # an alias bomb is refused from the token stream, unbuilt


@pytest.mark.parametrize(
    "flag",
    [
        ["--experimental-rerun", "{pickle}"],
        ["--config-path", "{dir}"],
        ["--config-name", "evil"],
        ["-cn", "evil"],
        ["--info"],
        ["--shell-completion"],
        ["--cfg", "hydra"],
        ["--hydra-help"],
    ],
)
@pytest.mark.parametrize("command", COMMANDS_TRIED)
def test_hydra_app_flags_are_refused(flag, command, world, capsys, caplog) -> None:
    rerun = world["dir"] / "config.pickle"
    rerun.parent.mkdir(parents=True, exist_ok=True)
    rerun.write_bytes(pickle.dumps(Touch(world["marker"])))
    args = [a.format(pickle=rerun, dir=world["dir"]) for a in flag]
    code, _, err = attempt(command, args, capsys, caplog)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "command line" in lines[0], (code, err)
    assert not world["marker"].exists()


@pytest.mark.parametrize(
    "sweep", ["hydra.run.dir=a,b", "workload.num_tokens=${oc.env:HOME},8", "strategy=../x,y"]
)
def test_a_sweep_checks_every_job_like_a_single_run(sweep, capsys) -> None:
    """`-m` expands the values, then each job's overrides meet the same checks: a hydra.* key,
    a resolver or a path-like option fails its job (a config error row), and nothing runs."""
    from pipeline.cli import COMMANDS, run_command

    code = run_command(COMMANDS["run"], ["-m", sweep, "--json"], "run")
    jobs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 2 and len(jobs) == 2
    assert jobs[0]["verdict"] == "config error" and jobs[0]["result"] is None


def test_names_cannot_forge_output(world, capsys, caplog) -> None:
    """A name with terminal control characters prints escaped: no colour, no cleared screen,
    no fake line of output."""
    args = write(
        world,
        "model/forged.yaml",
        'defaults: [tiny_mla, _self_]\nname: "m\\e[2J\\e[32m\\nverified: bit-exact"\n',
    )
    code, out, _ = attempt("explain", [*args, "model=forged"], capsys, caplog)
    assert code == 0
    assert "\x1b" not in out and "\\x1b[2J" in out
    assert not any(line.startswith("verified") for line in out.splitlines())


def test_validate_lists_every_mistake_of_a_folder_once(world, capsys, caplog) -> None:
    """Ten mistakes in three files, one of them a YAML syntax error: all ten, with file and
    line; the broken file does not stop the others from being checked."""
    write(world, "topology/broken.yaml", "defaults: [tp2, _self_]\nname: [broken\n")
    write(
        world,
        "model/bad.yaml",
        "defaults: [tiny_mla, _self_]\nname: bad\nnum_layrs: 3\nkv_dtype: int3\npage_size: many\n"
        "kv_row_bytes: -4\n",
    )
    args = write(
        world,
        "strategy/bad.yaml",
        "defaults: [replicated, _self_]\nname: bad\nchunk_pages: -1\nstaging_bytes: 0\n"
        "verify_every: -2\nidle_sync_skip:\n  max_skips: 0\nbackup:\n  finish:\n"
        "    - _target_: os.system\n",
    )
    code, out, _ = attempt("validate", [*args, "--json"], capsys, caplog)
    assert code == 1
    errors = json.loads(out)["errors"]
    got = sorted((Path(e["file"]).name, e["line"], e["key"]) for e in errors)
    assert got == [
        ("bad.yaml", 3, "model.num_layrs"),
        ("bad.yaml", 3, "strategy.chunk_pages"),
        ("bad.yaml", 4, "model.kv_dtype"),
        ("bad.yaml", 4, "strategy.staging_bytes"),
        ("bad.yaml", 5, "model.page_size"),
        ("bad.yaml", 5, "strategy.verify_every"),
        ("bad.yaml", 6, "model.kv_row_bytes"),
        ("bad.yaml", 7, "strategy.idle_sync_skip.max_skips"),
        ("bad.yaml", 10, "strategy.backup.finish[0]"),
        ("broken.yaml", 3, ""),
    ], errors
    (broken,) = [e for e in errors if e["file"].endswith("broken.yaml")]
    assert "YAML syntax error (line 3, column 1)" in broken["message"]


BAD_KNOBS = {
    "run": [
        "workload.cycles=0",
        "workload.num_tokens=7",  # not whole pages of 4
        "workload.device_tokens=256",  # cannot hold source and target of 256 tokens
        "workload.host_ratio=0.01",  # the host pool cannot hold the transfer
        "workload.host_ratio=0",
        "workload.device_tokens=4000000000000",  # far more than this machine's memory
        "strategy.chunk_pages=-1",
        "strategy.staging_bytes=0",
        "strategy.verify_every=-2",
        "strategy.idle_sync_skip.max_skips=0",
        "strategy.cuda_graph_cache=-1",
        "strategy=rotating strategy.staging_bytes=100",  # smaller than one page of a layer
        "runtime.timeout_s=0",
        "topology.tp_size=0",
        "topology.tp_size=100000",  # more ranks than any topology may have
        "topology=tp8 topology.tp_size=1024",  # more local ranks than this machine holds
        "model.num_layers=100000",  # more layers than any model may have
        "topology.dp_size=2",  # needs dp_attention
        "model.page_size=0",
        "model.kv_row_bytes=63",  # not whole bf16 elements
        "runtime.trace_file={victim}",  # exists: a run overwrites nothing
    ],
    "simulate": ["simulate.seeds=[]", "simulate.steps=0", "simulate.arrive_prob=2"],
    "bench": ["bench.sizes=[]", "bench.sizes=[102]", "bench.repeats=0", "bench.strategies=[]"],
    "check-ordering": ["model.num_layers=0"],
}


@pytest.mark.parametrize(
    ("command", "knobs"),
    [(command, knobs) for command, cases in BAD_KNOBS.items() for knobs in cases],
)
def test_no_config_mistake_reaches_a_rank(command, knobs, world, capsys, caplog) -> None:
    """Each bad knob: exit 2, one line naming the key, and no rank process started."""
    args = [a.format(victim=world["victim"]) for a in knobs.split()]
    if "topology.tp_size=1024" in args and RANKS_PER_CORE * (os.cpu_count() or 1) >= 1024:
        pytest.skip("this machine could start 1024 local ranks")
    said = refused(command, args, world, capsys, caplog)
    key = args[-1].split("=")[0]
    assert key.rpartition(".")[0] in said or key in said, said


def test_a_stages_folder_in_the_working_directory_is_never_imported(tmp_path: Path) -> None:
    """`python -m pipeline` puts the current folder first on sys.path: a `stages/` there would
    shadow the project's own and run its `__init__` (S1). It is refused before any import."""
    planted = tmp_path / "stages"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (planted / "evil.py").write_text("class Evil:\n    def on_step(self, t, step, stream): ...\n")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "explain", "strategy=rotating"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert not marker.exists()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "not this project's" in done.stderr and "shadows it" in done.stderr


def test_bench_outputs_never_follow_a_planted_link(tmp_path: Path) -> None:
    """S6: a link planted at bench.out_dir/bench.md is refused before any rank starts, and a
    link planted later (between the check and the write) is never written through."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("keep me")
    (out / "bench.md").symlink_to(victim)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "bench", "model=tiny_mla", f"bench.out_dir={out}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "bench.out_dir" in done.stderr and "is a link" in done.stderr
    assert victim.read_text() == "keep me"
    with pytest.raises(OSError):
        write_output(out / "bench.md", "overwritten?")
    os.mkfifo(out / "fifo")
    with pytest.raises(OSError):
        write_output(out / "fifo", "blocked?")  # without a reader: refused, never blocks
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("planted", ["link", "fifo", "device"])
@pytest.mark.parametrize("command", ["validate", "explain"])
def test_a_config_file_is_read_only_if_it_is_a_regular_file(
    planted: str, command: str, world, capsys, caplog
) -> None:
    """S8: a link in --config-dir to a file elsewhere is not read (its contents would be
    echoed in the errors), a FIFO never blocks, a device (a link to /dev/zero) is refused."""
    secret = world["victim"].parent / "secret.yaml"
    secret.write_text("num_layers: hunter2-secret\n")
    folder = world["dir"] / "model"
    folder.mkdir(parents=True)
    option = folder / "planted.yaml"
    if planted == "link":
        option.symlink_to(secret)
    elif planted == "fifo":
        os.mkfifo(option)
    else:
        option.symlink_to("/dev/zero")
    args = ["--config-dir", str(world["dir"])]
    said = refused(
        command, [*args, "model=planted"] if command == "explain" else args, world, capsys, caplog
    )
    assert "hunter2" not in said
    assert "planted.yaml" in said and "not read: " in said


def mooncake_option(world: dict[str, Path], name: str, master: str, metadata: str) -> list[str]:
    """A storage option `name` in the user folder that names a master and a metadata server;
    the arguments that give the folder."""
    folder = world["dir"] / "storage"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text(
        f"defaults:\n  - base_storage\nkind: mooncake\nmaster: {master}\n"
        f"metadata_server: {metadata}\n"
    )
    return ["--config-dir", str(world["dir"])]


@pytest.mark.parametrize("command", ["validate", "explain"])
def test_a_config_file_cannot_point_the_ranks_at_a_network_address(
    command: str, world, capsys, caplog
) -> None:
    """S7: storage.master and storage.metadata_server come from the command line only."""
    args = mooncake_option(world, "theirs", "10.0.0.66:50051", "http://10.0.0.66:8080/metadata")
    said = refused(
        command, [*args, "storage=theirs"] if command == "explain" else args, world, capsys, caplog
    )
    assert "storage.master may not be set in a config file" in said


def test_the_operator_may_allow_the_endpoints_a_config_file_names(world, capsys, caplog) -> None:
    """--allow-endpoint HOST:PORT (repeatable) lets a file name exactly that address; any
    other stays refused, and the library's compose takes the same list."""
    args = mooncake_option(world, "prod", "10.0.0.5:50051", "P2PHANDSHAKE")
    both = [*args, "--allow-endpoint", "10.0.0.5:50051", "--allow-endpoint=P2PHANDSHAKE"]
    code, out, err = attempt("validate", both, capsys, caplog)
    assert code == 0 and out.rstrip().endswith("valid"), out + err
    said = refused("validate", [*args, "--allow-endpoint", "10.0.0.5:50051"], world, capsys, caplog)
    assert "storage.metadata_server may not be set" in said and "storage.master" not in said
    assert "--allow-endpoint" in said
    job = pipeline.compose(
        ["storage=prod"],
        config_dir=str(world["dir"]),
        allowed_endpoints=["10.0.0.5:50051", "P2PHANDSHAKE"],
    )
    assert job.storage.master == "10.0.0.5:50051"


def test_credentials_in_a_metadata_url_are_refused_and_never_printed(world, capsys, caplog) -> None:
    url = "storage.metadata_server=http://admin:hunter2@127.0.0.1:8080/metadata"
    said = refused(
        "explain", ["storage=mooncake", "storage.master=127.0.0.1:5", url], world, capsys, caplog
    )
    assert "hunter2" not in said and "without credentials" in said


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("runtime.timeout_s=nan", "runtime.timeout_s"),
        ("runtime.timeout_s=1e300", "runtime.timeout_s"),
        ("workload.host_ratio=inf", "workload.host_ratio"),
        ("soak.max_rss_growth_mb=nan", "soak.max_rss_growth_mb"),
    ],
)
def test_numbers_that_are_not_finite_are_refused_naming_the_key(
    override: str, key: str, world, capsys, caplog
) -> None:
    said = refused("plan", [override], world, capsys, caplog)  # explain lists it, exit 0
    assert f"{key}=" in said and "finite" in said


def test_a_sweep_is_counted_before_it_is_built(world, capsys, caplog) -> None:
    """A range of 300 million jobs is refused at once (it was expanded first: MemoryError)."""
    said = refused("explain", ["-m", "workload.seed=range(0,300000000)"], world, capsys, caplog)
    assert "a sweep of more than 256 jobs" in said


@pytest.mark.parametrize(
    ("override", "lacks"),
    [
        ("strategy.l3.fetch=[]", "strategy.l3.fetch lacks stages.read_objects.ReadObjects"),
        ("strategy.backup.per_step=[]", "strategy.backup.per_step lacks stages.copy.Copy"),
        ("strategy.load.per_step=[]", "strategy.load.per_step lacks stages.copy.Copy"),
        ("strategy.load.finish=[]", "strategy.load.finish lacks stages.record_event.RecordEvent"),
        ("strategy.load.exchange=[]", "strategy.load.exchange lacks stages.broadcast.Broadcast"),
        ("strategy.l3.write_back=[]", "strategy.l3.write_back lacks stages.write_objects.Write"),
    ],
)
def test_a_strategy_that_cannot_move_its_bytes_is_refused_naming_the_missing_stage(
    override: str, lacks: str, world, capsys, caplog
) -> None:
    """Each of these was accepted: an empty fetch reported every page a hit, an empty backup
    acked with nothing copied, empty load lists timed out, rotating without a broadcast
    mismatched."""
    said = refused("explain", ["strategy=rotating", override], world, capsys, caplog)
    assert lacks in said


@pytest.mark.parametrize(
    ("overrides", "said_part"),
    [
        (["storage=file", "storage.path="], "storage.path='': name a folder"),
        (["storage=file", "storage.path=victim.txt"], "not a folder"),
        (["runtime.trace_file=missing/ops.jsonl"], "no folder 'missing'"),
    ],
)
def test_where_a_run_writes_is_checked_before_any_rank_starts(
    overrides: list[str], said_part: str, world, capsys, caplog
) -> None:
    """storage.path='' wrote objects into the current folder; a file as storage.path and a
    trace file in a missing folder failed only after the whole run (its report lost)."""
    said = refused("run", overrides, world, capsys, caplog)
    assert said_part in said


@pytest.mark.parametrize("command", ["validate", "explain"])
@pytest.mark.parametrize("group", ["model", "strategy", "storage"])
def test_a_config_group_cannot_be_removed(group: str, command: str, world, capsys, caplog):
    """`~model` (Hydra's delete) gave an OmegaConf traceback."""
    said = refused(command, [f"~{group}"], world, capsys, caplog)
    assert f"~{group}: a config group cannot be removed; pick one of its options" in said, said


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.indexer.layers=[0,1]", "model.indexer.layers"),
        ("+model.indexer.row_bytes=16", "model.indexer.row_bytes"),
        ("model.indexer={row_bytes:16}", "model.indexer"),
    ],
)
def test_an_indexer_key_of_a_model_without_one_is_named(override, key, world, capsys, caplog):
    """`model.indexer.layers=[...]` on an MLA model named no key ("the overrides do not
    compose"); on a DSA model it sets the indexer's layers."""
    said = refused("explain", [override], world, capsys, caplog)
    assert f"{key}: model.indexer is null here" in said and "DSA" in said, said
    job = pipeline.compose(["model=tiny_dsa", "model.indexer.layers=[0,1]"])
    assert job.model.indexer_layers == (0, 1)
    assert pipeline.compose(["model=deepseek_v32"]).model.indexer is not None  # the one named


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (
            ["runtime.timeout_s=1e12"],
            f"runtime.timeout_s=1000000000000.0: must lie in [0.001, {WEEK_S}]",
        ),
        (["storage=file", "storage.prefetch_timeout_s=1e12"], "storage.prefetch_timeout_s=1000000"),
        (["topology=tp2", "runtime.metrics_port=65535"], "rank 1 would serve on 65536"),
        (
            [
                "events=zmq",
                "topology=tp2",
                "strategy=replicated",
                "events.endpoint='tcp://[::1]:65535'",
            ],
            "events.endpoint: 2 publisher(s) an engine at data-parallel rank(s) 0 bind ports "
            "65535-65536, beyond 65535",
        ),
        (
            ["events=zmq", "events.replay_endpoint=tcp://127.0.0.1:99999"],
            "bind ports 99999-100000, beyond 65535",
        ),
        (
            ["events=zmq", "topology=tp2", "strategy=replicated", "runtime.metrics_port=5558"],
            "events.endpoint: ports 5557-5558 overlap runtime.metrics_port's 5558-5559",
        ),
        (
            ["events=zmq", "topology=tp2", "events.dp_rank=5", "strategy=replicated"],
            "events.replay_endpoint: ports 5567-5578 overlap events.endpoint's 5557-5568",
        ),
        (["bench.floor_bytes=1099511627776"], "bench.floor_bytes=1099511627776: must lie in"),
        (["workload.seed=1000000000000000"], "workload.seed=1000000000000000: must lie in"),
    ],
)
def test_numbers_that_validated_and_then_crashed_are_refused(
    overrides: list[str], said: str, world, capsys, caplog
) -> None:
    """Each of these validated, then crashed a run: an OverflowError in a thread's wait, a
    rank's port past 65535, a 1 TiB buffer per rank, a seed past torch's generator. Every
    knob's range: `pipeline.config.ranges` (tests/unit/test_knob_ranges.py)."""
    assert said in refused("plan", overrides, world, capsys, caplog)


def test_a_port_for_every_rank_is_taken() -> None:
    """The largest port that leaves one for every rank is accepted."""
    assert job_config("topology=tp2", "runtime.metrics_port=65534").runtime.metrics_port == 65534
