"""`hicache-pipeline <subcommand> [--json] [Hydra overrides and flags]`.

Thin: each subcommand composes the config through one Hydra app (so `key=value`, `group=option`,
`+key=`, `~key`, `--cfg job`, `--help`, `--config-dir DIR` and `-m` all work) and hands the
result to a plain function. `--json` prints one JSON document on stdout; logs go to stderr.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Callable

from pipeline.config.app import hydra_main
from pipeline.config.compose import Session
from pipeline.config.validate import check_config, group_options, validate_all
from pipeline.engine.runtime import pick_device
from pipeline.jobs import deadlock_model, report
from pipeline.jobs.bench import run_bench
from pipeline.jobs.bench.output import markdown
from pipeline.jobs.launch import RankFailure, launch
from pipeline.jobs.plan_report import broadcasts_per_layer, plan_report
from pipeline.jobs.run import backend_of, run_rank
from pipeline.jobs.simulate import simulate_rank
from pipeline.jobs.simulate import summarize as summarize_simulation

log = logging.getLogger("hicache-pipeline")

Handler = Callable[[Session, bool], int]


def explain(session: Session, as_json: bool) -> int:
    """Verdict, effective strategy and every rule of the requested strategy."""
    verdict = session.verdict()
    print(
        json.dumps(verdict.as_dict(), indent=2)
        if as_json
        else report.verdict_text(verdict, session.model(), session.topology())
    )
    return 1 if session.cfg.strict and not verdict.active else 0


def plan(session: Session, as_json: bool) -> int:
    """Per-rank bytes, ops and host capacity of the effective strategy; moves nothing."""
    job = session.job()
    result = {**job.verdict.as_dict(), **plan_report(job)}
    print(json.dumps(result, indent=2) if as_json else report.plan_text(result))
    return 0


def run(session: Session, as_json: bool) -> int:
    """Back up, evict and load back on real ranks; exit 0 only when every rank is bit-exact."""
    job = session.job()
    verdict = job.verdict
    if not verdict.active:
        failed = "; ".join(f"{r.name}: {r.message}" for r in verdict.rules if not r.passed)
        if job.strict:
            print(
                f"error: strict: strategy {verdict.strategy} is inactive ({failed})",
                file=sys.stderr,
            )
            return 1
        log.warning(
            "strategy %s is inactive (%s); running %s",
            verdict.strategy,
            failed,
            verdict.effective_strategy,
        )
    backend = backend_of(job)
    ranks = launch(
        run_rank, job, job.topology.tp_size, backend=backend, timeout_s=job.runtime.timeout_s
    )
    if ranks is None:  # a torchrun rank other than 0: rank 0 reports
        return 0
    if job.runtime.trace_file is not None:
        report.write_trace(job.runtime.trace_file, ranks)
    result = {
        "verified": all(r["verified"] for r in ranks),
        "strategy": verdict.strategy,
        "effective_strategy": verdict.effective_strategy,
        "notes": list(verdict.notes),
        "model": job.model.name,
        "topology": job.topology.name,
        "device": pick_device(job.topology.device, 0).type,
        "ranks": ranks,
    }
    print(json.dumps(result, indent=2) if as_json else report.run_text(result))
    return 0 if result["verified"] else 1


def validate(session: Session, as_json: bool) -> int:
    """Every option of every group, or the one config the overrides compose."""
    if session.overrides:
        checked = ["overrides: " + " ".join(session.overrides)]
        errors = check_config(session.cfg, checked[0], group_options()["strategy"])
    else:
        checked, errors = validate_all(lambda o: Session.compose(o).cfg)
    result = {"valid": not errors, "checked": checked, "errors": errors}
    print(json.dumps(result, indent=2) if as_json else report.validate_text(result))
    return 0 if not errors else 1


def check_ordering(session: Session, as_json: bool) -> int:
    """Model one sharded load against the forward's collectives under each ordering design."""
    job = session.job()
    per_layer, group = broadcasts_per_layer(job)
    configured = job.strategy.config.ordering.value
    designs = {
        design: dataclasses.asdict(
            deadlock_model.check(deadlock_model.scenario(design, per_layer, group))
        )
        for design in deadlock_model.DESIGNS
    }
    result = {
        "strategy": job.verdict.strategy,
        "effective_strategy": job.verdict.effective_strategy,
        "ranks": group,
        "layers": len(per_layer),
        "broadcasts": sum(per_layer),
        "configured": configured,
        "designs": designs,
    }
    print(json.dumps(result, indent=2) if as_json else report.ordering_text(result))
    return 1 if designs[configured]["deadlock"] else 0


def bench(session: Session, as_json: bool) -> int:
    """Strategies side by side with a hand-written loop and the measured link floors."""
    result = run_bench(session)
    if not result:  # a torchrun rank other than 0
        return 0
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))
    else:
        print(markdown(result) + f"written to {session.cfg.bench.out_dir}/ ({result['png']})")
    ok = all(r["bit_exact"] and r["reference_bit_exact"] for r in result["rows"])
    return 0 if ok else 1


def simulate(session: Session, as_json: bool) -> int:
    """A randomized scheduler on real ranks: ack polls with the idle-sync skip off and on."""
    job = session.job()
    ranks = launch(
        simulate_rank,
        job,
        job.topology.tp_size,
        backend=backend_of(job),
        timeout_s=job.runtime.timeout_s,
    )
    if ranks is None:
        return 0
    result = {"predicate": job.simulate.predicate.value, **summarize_simulation(ranks)}
    print(json.dumps(result, indent=2) if as_json else report.simulate_text(result))
    return 0 if result["ok"] else 1


COMMANDS: dict[str, Handler] = {
    "run": run,
    "explain": explain,
    "plan": plan,
    "validate": validate,
    "check-ordering": check_ordering,
    "bench": bench,
    "simulate": simulate,
}

USAGE = """usage: hicache-pipeline SUBCOMMAND [--json] [OVERRIDE ...] [--cfg job] [--help]
                        [--config-dir DIR]

subcommands:
  run       back up, evict and load back on real ranks; prove every rank bit-exact
  explain   is the strategy active for this topology? every rule, its fix, the fallback
  plan      per-rank bytes, ops and host capacity, without moving a byte
  validate  check every shipped config (and --config-dir), or the one the overrides compose
  check-ordering  can the load's broadcasts deadlock against the forward's collectives?
  bench     strategies side by side with a hand-written loop and the links' floors (GPU)
  simulate  a randomized scheduler proves the ack poll and its idle-sync skip on real ranks

overrides use Hydra's grammar, e.g.
  hicache-pipeline run strategy=rotating topology=tp4 workload.placement=fragmented
  hicache-pipeline explain strategy=rotating topology=h200x8_dp8 --json
"""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    command = args.pop(0)
    if command not in COMMANDS:
        print(f"unknown subcommand {command!r}\n\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    as_json = "--json" in args
    handler = COMMANDS[command]

    def task(session: Session) -> int:
        try:
            return handler(session, as_json)
        except (ValueError, RankFailure) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1

    hydra_main(command, [a for a in args if a != "--json"], task)
