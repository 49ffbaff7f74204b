"""The cost model's numbers as the subcommands show them: `explain`'s table of every strategy
and the winner, and `plan`'s per-rank estimate of a Job (`plan_estimate`).

`plan_estimate(job, links)` is what `plan` calls: the effective strategy's estimate on the
job's workload, per rank of the first replica group (every group moves the same bytes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config.costs import Ranking, case_of
from pipeline.config.eligibility import RuleResult
from pipeline.config.job import Job
from pipeline.core.cost import Estimate, Leg, Links, estimate
from pipeline.jobs.report import human_bytes, printable


def _ms(leg: Leg | None) -> str:
    return "-" if leg is None else f"{leg.seconds * 1e3:.2f}"


def estimates_text(r: Ranking, warnings: list[RuleResult], auto: bool) -> str:
    """Every strategy's estimate, the winner and why, and each failed warning with its fix."""
    c = r.case
    placement = "fragmented" if c.fragmented else "contiguous"
    lines = [
        f"estimates (links {printable(r.links.machine)}; {c.tokens} tokens {placement}, "
        f"io {c.topology.io_backend.value}, storage {c.store.value}):",
        f"  {'strategy':<14} {'active':<6} {'backup ms':>10} {'load ms':>10} {'L3 load ms':>11} "
        f"{'bytes/rank':>11}  load bound by",
    ]
    for x in r.candidates:
        e = x.estimate
        peak = max(rk.host_link_bytes for rk in e.ranks)
        bound = (e.l3_load or e.load).bound
        lines.append(
            f"  {printable(x.option):<14} {'yes' if x.active else 'no':<6} {_ms(e.backup):>10} "
            f"{_ms(e.load):>10} {_ms(e.l3_load):>11} {human_bytes(peak):>11}  {bound}"
        )
    said = "picked by strategy=auto" if auto else "what strategy=auto would run"
    lines.append(f"winner: {printable(r.winner.option)} ({said}): {r.reason()}")
    lines += [f"WARN {w.name}: {printable(w.message)}" for w in warnings]
    return "\n".join(lines)


def case_estimate(job: Job, tokens: int, fragmented: bool, links: Links) -> Estimate:
    """The estimate of one bench case: `tokens` moved by the job's strategy, its pages
    consecutive or not (a bench sets placement per case, not in the workload)."""
    graphs = job.strategy.config.cuda_graph_cache
    case = case_of(job.model, job.topology, job.workload, job.storage, graphs)
    case = dataclasses.replace(case, tokens=tokens, fragmented=fragmented)
    return estimate(case, job.strategy.config.ownership, links)


def plan_estimate(job: Job, links: Links) -> dict[str, Any]:
    """The effective strategy's estimate on this job's workload: its legs and, per rank of
    the first replica group, the bytes over the host link, broadcast and read from L3."""
    graphs = job.strategy.config.cuda_graph_cache
    case = case_of(job.model, job.topology, job.workload, job.storage, graphs)
    e: Estimate = estimate(case, job.strategy.config.ownership, links)
    return {
        "links": links.machine,
        **e.as_dict(),
        "ranks": [
            {
                "rank": rk.rank,
                "host_link_bytes": rk.host_link_bytes,
                "broadcast_sent_bytes": rk.broadcast_sent_bytes,
                "broadcast_received_bytes": rk.broadcast_received_bytes,
                "l3_read_bytes": rk.l3_read_bytes,
            }
            for rk in e.ranks
        ],
    }


def plan_estimate_text(planned: dict[str, Any]) -> str:
    """`plan_estimate`'s result as `plan` prints it: the legs, then the bytes of each rank."""
    legs = [
        f"{name} {leg['ms']:.2f} ms ({leg['bound']})"
        for name, leg in (
            ("backup", planned["backup"]),
            ("load", planned["load"]),
            ("L3 load", planned["l3_load"]),
            ("write-back", planned["write_back"]),
        )
        if leg is not None
    ]
    lines = [f"estimate (links {printable(planned['links'])}): {', '.join(legs)}"]
    lines.append(
        f"{'rank':>4}  {'host link':>11}  {'bcast send':>11}  {'bcast recv':>11}  {'L3 read':>11}"
    )
    lines += [
        f"{r['rank']:>4}  {human_bytes(r['host_link_bytes']):>11}  "
        f"{human_bytes(r['broadcast_sent_bytes']):>11}  "
        f"{human_bytes(r['broadcast_received_bytes']):>11}  {human_bytes(r['l3_read_bytes']):>11}"
        for r in planned["ranks"]
    ]
    return "\n".join(lines)
