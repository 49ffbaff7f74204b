"""The subcommands: each hands the checked config to a plain job function and prints the
result (`--json`: one JSON document on stdout; logs go to stderr)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from pipeline.cli.catalog import catalog_text, options_by_group
from pipeline.cli.explain import explanation_text
from pipeline.cli.failure import Refused, failed
from pipeline.cli.invocation import Handler, Invocation, emit
from pipeline.config.drive_schemas import BenchKind
from pipeline.config.explain import explained
from pipeline.config.job import Job
from pipeline.config.links import links_of
from pipeline.config.validate import validate_all, validate_one
from pipeline.core.checks import ConfigError, Problem, raise_problems
from pipeline.engine.runtime import pick_device
from pipeline.jobs import deadlock_model, report
from pipeline.jobs.bench import run_bench
from pipeline.jobs.bench.kinds import OTHER_BENCHES
from pipeline.jobs.bench.l3 import run_l3_bench
from pipeline.jobs.bench.l3_report import l3_markdown
from pipeline.jobs.bench.output import markdown
from pipeline.jobs.cost_report import plan_estimate, plan_estimate_text
from pipeline.jobs.l3_store import blamed_on_a_dead_store, concrete
from pipeline.jobs.launch import launch
from pipeline.jobs.plan_report import broadcasts_per_layer, plan_report
from pipeline.jobs.report import printable
from pipeline.jobs.resources import resource_problems
from pipeline.jobs.run import run_rank
from pipeline.jobs.simulate import simulate_rank
from pipeline.jobs.simulate import summarize as summarize_simulation
from pipeline.jobs.soak import soak_rank
from pipeline.jobs.soak import summarize as summarize_soak
from pipeline.jobs.spawn import RankFn

log = logging.getLogger("hicache-pipeline")


def launch_ranks(fn: RankFn, job: Job, *, job_s: float | None = None) -> list[Any] | None:
    """`fn` on every rank with the job's L3 store in place (a temporary folder, or a master on
    loopback, for the length of the job); None on torchrun ranks other than 0."""
    with concrete(job.storage) as storage, blamed_on_a_dead_store(storage):
        return launch(
            fn,
            dataclasses.replace(job, storage=storage),
            job.topology.tp_size,
            backend=job.recipe().backend_name(),
            timeout_s=job.runtime.timeout_s,
            job_s=job_s,
        )


def inactive(job: Job) -> str | None:
    """Why the requested strategy falls back, or None when it is active."""
    verdict = job.verdict
    if verdict.active:
        return None
    return "; ".join(f"{r.name}: {r.message}" for r in verdict.rules if not r.passed)


def strict_refusal(job: Job, as_json: bool = False) -> bool:
    """With strict=true, an inactive strategy is an error (said on stderr, and as JSON on
    stdout with `--json`) instead of a fallback: every subcommand that resolves a strategy
    asks this first."""
    why = inactive(job)
    if job.strict and why is not None:
        strategy = printable(job.verdict.strategy)
        failed(as_json, Refused(f"strict: strategy {strategy} is inactive ({why})"), 1)
        return True
    return False


def runnable_job(inv: Invocation) -> Job | None:
    """The job of a subcommand that starts ranks: None when strict refuses its fallback,
    ConfigError when this machine cannot hold its pools."""
    job = inv.job()
    if strict_refusal(job, inv.line.as_json):
        return None
    raise_problems(resource_problems(job))
    return job


def explain(inv: Invocation) -> int:
    """Verdict, effective strategy (or none) and every rule of the requested strategy and its
    fallbacks, and every problem a run would refuse: it answers for any config that composes
    (exit 0; strict: 1 when the requested strategy is inactive)."""
    explanation = explained(inv.line.overrides, inv.sources, inv.reads)
    if inv.line.as_json:
        print(json.dumps(explanation.as_dict(), indent=2))
    else:
        print(explanation_text(explanation))
    return 1 if explanation.strict and not explanation.active else 0


def plan(inv: Invocation) -> int:
    """Per-rank bytes, ops and host capacity of the effective strategy; moves nothing."""
    job = inv.job()
    if strict_refusal(job, inv.line.as_json):
        return 1
    planned = {**job.verdict.as_dict(), **plan_report(job)}
    planned["estimate"] = plan_estimate(job, links_of(job.runtime.links))
    emit(inv, planned, plan_with_estimate_text)
    return 0


def plan_with_estimate_text(planned: dict) -> str:
    """plan's table (with the verdict's notes: what strategy=auto picked and why) and the
    cost model's estimate of the same plan."""
    return report.plan_text(planned) + "\n" + plan_estimate_text(planned["estimate"])


def run(inv: Invocation) -> int:
    """Back up, evict and load back on real ranks; exit 0 only when every rank is bit-exact."""
    job = inv.job()
    verdict, why = job.verdict, inactive(job)
    if strict_refusal(job, inv.line.as_json):
        return 1
    if why is not None:
        log.warning(
            "strategy %s is inactive (%s); running %s",
            *map(printable, (verdict.strategy, why, verdict.effective_strategy)),
        )
    guards = resource_problems(job)
    trace = job.runtime.trace_file
    if trace is not None and (Path(trace).exists() or Path(trace).is_symlink()):
        message = f"runtime.trace_file={trace!r} exists: name a new file (a run overwrites none)"
        guards.append(Problem("runtime.trace_file", message))
    elif trace is not None and not Path(trace).parent.is_dir():
        message = f"runtime.trace_file={trace!r}: no folder {str(Path(trace).parent)!r}"
        guards.append(Problem("runtime.trace_file", message))
    raise_problems(guards)
    ranks = launch_ranks(run_rank, job)
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
        "topology_label": job.topology.label,
        "device": pick_device(job.topology.device, 0).type,
        "ranks": ranks,
    }
    emit(inv, result, report.run_text)
    return 0 if result["verified"] else 1


def validate(inv: Invocation) -> int:
    """Every option of every group, or the one config the overrides compose."""
    if inv.line.overrides:
        checked = ["overrides: " + " ".join(inv.line.overrides)]
        problems, warnings = validate_one(inv.line.overrides, inv.sources)
    else:
        checked, problems, warnings = validate_all(inv.sources)
    result = {
        "valid": not problems,
        "checked": checked,
        "errors": [p.as_dict() for p in problems],
        "warnings": [w.as_dict() for w in warnings],
    }
    emit(inv, result, report.validate_text)
    return 0 if not problems else 1


def check_ordering(inv: Invocation) -> int:
    """Model one sharded load against the forward's collectives under each ordering design."""
    job = inv.job()
    if strict_refusal(job, inv.line.as_json):
        return 1
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
        "notes": list(job.verdict.notes),
    }
    emit(inv, result, report.ordering_text)
    return 1 if designs[configured]["deadlock"] else 0


def bench(inv: Invocation) -> int:
    """Strategies side by side with a hand-written loop and the measured link floors; with
    `bench.stores`, their load-backs from L3 side by side instead."""
    session = inv.session()
    kind = inv.job().bench.kind
    if kind is not BenchKind.transfers:
        run, text = OTHER_BENCHES[kind]
        other = run(session)
        if other:  # {} on a torchrun rank other than 0
            emit(inv, other, text)
        return 0 if not other or other["ok"] else 1
    out_dir, l3 = inv.job().bench.out_dir, bool(inv.job().bench.stores)
    result = (run_l3_bench if l3 else run_bench)(session)  # checks every case first
    if not result:  # a torchrun rank other than 0
        return 0
    shown = {k: v for k, v in result.items() if k != "raw"}
    where = f"written to {out_dir}/" + ("" if l3 else f" ({result['png']})")
    emit(inv, shown, lambda r: (l3_markdown(r) if l3 else markdown(r)) + where)
    exact = [r["bit_exact"] and r.get("reference_bit_exact", True) for r in result["rows"]]
    return 0 if all(exact) else 1


def simulate(inv: Invocation) -> int:
    """A randomized scheduler on real ranks: ack polls with the idle-sync skip off and on."""
    job = runnable_job(inv)
    if job is None:
        return 1
    ranks = launch_ranks(simulate_rank, job)
    if ranks is None:
        return 0
    result = {
        "predicate": job.simulate.predicate.value,
        **summarize_simulation(ranks),
        "notes": list(job.verdict.notes),
    }
    emit(inv, result, report.simulate_text)
    return 0 if result["ok"] else 1


def soak(inv: Invocation) -> int:
    """Many rounds on real ranks: every one bit-exact, and each rank's memory flat."""
    job = runnable_job(inv)
    if job is None:
        return 1
    ranks = launch_ranks(soak_rank, job, job_s=job.runtime.timeout_s * (job.soak.cycles + 1))
    if ranks is None:
        return 0
    result = {**summarize_soak(job, ranks), "notes": list(job.verdict.notes)}
    emit(inv, result, report.soak_text)
    return 0 if result["verified"] and result["flat"] else 1


def list_options(inv: Invocation) -> int:
    """Every option of every config group with its one-line description (`*`: the default)."""
    if inv.line.overrides:
        shown = printable(" ".join(inv.line.overrides))
        message = (
            f"list shows every option and takes no overrides (got {shown}): give them to the "
            "subcommand that composes a config (e.g. explain, plan, --cfg job)"
        )
        raise ConfigError([Problem("", message, "command line")])
    result = {"groups": options_by_group(inv.sources)}
    emit(inv, result, catalog_text)
    return 0


COMMANDS: dict[str, Handler] = {
    "run": run,
    "explain": explain,
    "plan": plan,
    "validate": validate,
    "check-ordering": check_ordering,
    "bench": bench,
    "simulate": simulate,
    "soak": soak,
    "list": list_options,
}
