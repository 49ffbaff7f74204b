"""The command line: `hicache-pipeline SUBCOMMAND [flags] [OVERRIDE ...]`, its help texts and
exit codes (2: a config mistake, one line, before any rank starts; 1: a failed rank or a
failed check)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from importlib.metadata import version

from pipeline.cli.commands import COMMANDS
from pipeline.cli.failure import failed
from pipeline.cli.invocation import Handler, Invocation
from pipeline.cli.store import store_main
from pipeline.cli.sweep import run_sweep
from pipeline.config.app import CommandLine, configs
from pipeline.config.compose import ALL_GROUPS, READS
from pipeline.core.checks import ConfigError
from pipeline.jobs.report import printable
from pipeline.jobs.spawn import RankFailure

CLOSED_PIPE = 128 + signal.SIGPIPE
"""The exit code when stdout's reader went away (`| head`): what a process that SIGPIPE
ended reports."""

FLAGS = (
    "[--json] [--config-dir DIR] [--allow-endpoint HOST:PORT] [--cfg job] [--verbose] [--help] "
    "[OVERRIDE ...]"
)

HELP: dict[str, tuple[str, str, str]] = {
    "run": (
        "back up, evict and load back on real ranks; prove every rank bit-exact",
        "strategy=, topology=, model=, storage=, workload.num_tokens, workload.placement, "
        "workload.cycles, runtime.trace_file, strict=true (fail if the strategy falls back)",
        "hicache-pipeline run strategy=rotating topology=tp4 workload.placement=fragmented",
    ),
    "explain": (
        "is the strategy active for this topology? every rule, its fix, the fallback",
        "strategy=, topology=, model=, storage=, strict=true (exit 1 when inactive)",
        "hicache-pipeline explain strategy=rotating topology=h200x8_dp8 --json",
    ),
    "plan": (
        "per-rank bytes, ops and host capacity, without moving a byte",
        "strategy=, topology=, model=, workload.num_tokens, storage=, strict=true",
        "hicache-pipeline plan strategy=rotating topology=tp8 model=deepseek_v3",
    ),
    "validate": (
        "check every shipped config (or those of --config-dir), or the one the overrides compose",
        "--config-dir DIR (your options, DIR/<group>/<name>.yaml; your deployment's defaults, "
        "DIR/config.yaml), --json (file, key, line)",
        "hicache-pipeline validate --config-dir my_conf --json",
    ),
    "check-ordering": (
        "can the load's broadcasts deadlock against the forward's collectives?",
        "strategy=, topology=, strategy.ordering (gate | forward_stream), strict=true",
        "hicache-pipeline check-ordering strategy=rotating topology=tp4",
    ),
    "bench": (
        "strategies side by side with a hand-written loop and the links' floors (GPU); "
        "bench=l3: load-back from L3 per store",
        "bench.sizes, bench.strategies, bench.placements, bench.repeats, bench.out_dir, "
        "bench=l3 (bench.stores)",
        "hicache-pipeline bench model=deepseek_v3 topology.device=cuda bench.sizes=[16384]",
    ),
    "simulate": (
        "a randomized scheduler proves the ack poll and its idle-sync skip on real ranks",
        "simulate.steps, simulate.predicate, strategy.idle_sync_skip.enabled",
        "hicache-pipeline simulate strategy=rotating topology=tp4",
    ),
    "soak": (
        "thousands of rounds on real ranks: every one bit-exact, each rank's memory flat",
        "soak.cycles, soak.warmup_cycles, soak.max_rss_growth_mb",
        "hicache-pipeline soak soak.cycles=500",
    ),
    "list": (
        "every option of every config group, with its one-line description",
        "--config-dir DIR (your options are listed too), --json",
        "hicache-pipeline list",
    ),
}

USAGE = (
    f"usage: hicache-pipeline SUBCOMMAND {FLAGS}\n"
    "       hicache-pipeline --version\n\nsubcommands:\n"
    + "\n".join(f"  {name:<15} {summary}" for name, (summary, _, _) in HELP.items())
    + "\n\nan operator's commands on a file store's folder (storage.path):\n"
    "  store           stats | verify | evict FOLDER: what it holds, its corrupt objects, room\n"
    "\nhicache-pipeline SUBCOMMAND --help says more. Overrides use Hydra's grammar, e.g.\n"
    "  hicache-pipeline run strategy=rotating topology=tp4 workload.placement=fragmented\n"
)


def command_help(name: str) -> str:
    summary, knobs, example = HELP[name]
    return (
        f"usage: hicache-pipeline {name} {FLAGS}\n\n{summary}.\n\n"
        f"key knobs: {knobs}\n(`hicache-pipeline list` shows every option of every group; "
        f"`--cfg job` prints the composed config)\n\nexample:\n  {example}\n"
    )


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:  # a bare invocation is a mistake, not a request for help
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    if args[0] in ("-h", "--help"):
        print(USAGE)
        return
    if args[0] == "--version":
        print(f"hicache-pipeline {version('hicache-pipeline')}")
        return
    command = args.pop(0)
    if command not in COMMANDS and command != "store":
        print(f"unknown subcommand {printable(command)!r}\n\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="[%(asctime)s][%(name)s][%(levelname)s] %(message)s",
    )
    signal.signal(signal.SIGTERM, _exit_on_signal)  # so every cleanup runs, as on Ctrl-C
    try:
        if command == "store":
            code = store_main(args)
        else:
            code = run_command(COMMANDS[command], args, command)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of stdout is gone: nothing more to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        code = CLOSED_PIPE
    if code:
        raise SystemExit(code)


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the job as SystemExit does: ranks stopped, a temporary store and the ranks'
    folder removed, a master the job started stopped (the default action left them all)."""
    raise SystemExit(128 + signum)


def run_command(handler: Handler, args: list[str], name: str = "") -> int:
    """Parse, compose and run one subcommand: 2 for a config mistake (one line), 1 for a
    failed rank, the handler's own code otherwise."""
    as_json = "--json" in args
    try:
        line = CommandLine.parse(args)
        if line.help:
            print(command_help(name) if name in HELP else USAGE)
            return 0
        with verbose(line.verbose):
            reads = READS.get(name, ALL_GROUPS)
            if line.multirun:
                return run_sweep(lambda one: run_parsed(handler, one, reads), line)
            return run_parsed(handler, line, reads)
    except (ConfigError, ValueError) as e:
        return failed(as_json, e, 2)


@contextlib.contextmanager
def verbose(on: bool) -> Iterator[None]:
    """`--verbose`: this project's debug logs (Hydra's own words among them) for the block."""
    logger = logging.getLogger("hicache-pipeline")
    level = logger.level
    if on:
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)


def run_parsed(handler: Handler, line: CommandLine, reads: frozenset[str] = ALL_GROUPS) -> int:
    """One job: 2 for a config mistake (one line), 1 for a failed rank, else the handler's."""
    try:
        with configs(line.config_dir, line.allowed_endpoints) as sources:
            inv = Invocation(line, sources, reads)
            if line.cfg is not None:
                print(inv.config_text())
                return 0
            return handler(inv)
    except (ConfigError, ValueError) as e:
        return failed(line.as_json, e, 2)
    except RankFailure as e:
        return failed(line.as_json, e, 1)
