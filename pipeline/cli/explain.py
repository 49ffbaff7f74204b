"""`explain`'s text: the verdict of the requested strategy as `verdict_text` prints it, then
each fallback that was tried and is inactive too, the cost model's estimate of every strategy
with the winner and any warning, and every problem a run would refuse."""

from __future__ import annotations

from pipeline.config.eligibility import Verdict
from pipeline.config.explain import Explanation
from pipeline.jobs.cost_report import estimates_text
from pipeline.jobs.report import printable, verdict_text


def explanation_text(e: Explanation) -> str:
    chain, first = e.chain, e.chain.tried[0]
    effective = chain.effective if chain.effective is not None else "none"
    verdict = Verdict(first.strategy, first.active, effective, first.rules, chain.notes)
    lines = [verdict_text(verdict, e.model, e.topology)]
    for tried in chain.tried[1:]:
        if tried.active:
            continue
        lines.append(f"fallback {printable(tried.strategy)}: INACTIVE")
        width = max((len(r.name) for r in tried.rules), default=0)
        lines += [
            f"  {'ok  ' if r.passed else 'FAIL'} {r.name:<{width}}  {r.message}"
            for r in tried.rules
        ]
    if e.ranking is not None:
        lines.append(estimates_text(e.ranking, e.warnings, e.auto))
    if e.problems:
        lines.append("problems (run refuses this config until each is fixed):")
        lines += [f"  - {printable(p)}" for p in e.problems]
    return "\n".join(lines)
