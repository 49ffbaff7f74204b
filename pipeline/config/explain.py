"""`explain`'s verdict for any config that composes: the requested strategy and each fallback
tried after it, every rule of each with its message (the fix where it failed), the effective
strategy (None where no strategy of the chain is active), and every problem a run would be
refused for (workload, store, staging, the chain's dead end), each with its file and line.

It refuses (ConfigError) only a config it cannot judge: one that does not compose (a refused
override or user file, an unknown key or rule, a stage list the closed door refuses, a
fallback that is no option), or whose model, topology or store kind has a mistake of its own,
since the rules read them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.config.checked import (
    built_groups,
    rule_problems,
    strategy_stage_problems,
    unknown_keys,
)
from pipeline.config.compose import READS, Session
from pipeline.config.costs import AUTO, Ranking, ranking
from pipeline.config.deployment import Configs
from pipeline.config.eligibility import Chain, RuleResult, chain_of
from pipeline.config.overrides import checked_overrides
from pipeline.config.validate import checked_config, group_options
from pipeline.core.checks import ConfigError, Problem
from pipeline.core.model import ModelGeometry
from pipeline.core.topology import Topology


@dataclass(frozen=True)
class Explanation:
    """What `explain` says about one config."""

    chain: Chain
    problems: tuple[Problem, ...]
    """Every problem of the config, each naming its key and fix (none: it runs)."""
    model: ModelGeometry
    topology: Topology
    """As given (the rules read it normalized, see the chain's notes)."""
    strict: bool
    ranking: Ranking | None = None
    """The cost model's estimate of every strategy (None where one cannot be made: a group it
    reads has a mistake, listed in problems)."""
    auto: bool = False
    """strategy=auto chose the requested strategy."""

    @property
    def active(self) -> bool:
        return self.chain.tried[0].active

    @property
    def warnings(self) -> list[RuleResult]:
        """Advice that does not stop a run: the dedup rule where it fails."""
        effective = self.chain.effective
        if self.ranking is None or effective is None:
            return []
        found = self.ranking.warning(effective)
        return [found] if found is not None and not found.passed else []

    def as_dict(self) -> dict:
        """`explain --json`."""
        first = self.chain.tried[0]
        return {
            "strategy": first.strategy,
            "active": first.active,
            "effective_strategy": self.chain.effective,
            "rules": [dataclasses.asdict(r) for r in first.rules],
            "fallbacks": [t.as_dict() for t in self.chain.tried[1:]],
            "notes": list(self.chain.notes),
            "problems": [p.as_dict() for p in self.problems],
            "runs": self.chain.effective is not None and not self.problems,
            "auto": self.auto,
            "estimates": None if self.ranking is None else self.ranking.as_dict(),
            "warnings": [dataclasses.asdict(r) for r in self.warnings],
        }


def explained(
    overrides: list[str], loaded: Configs, reads: frozenset[str] = READS["explain"]
) -> Explanation:
    """The verdict of the config these overrides compose, and every problem of the groups a
    run reads (ConfigError where it cannot be judged, listing every problem)."""
    session, problems = checked_config(overrides, loaded, reads)
    if session is None:
        raise ConfigError(problems)
    unused = unused_files(loaded, session)  # validate's to check, not explain's
    problems = [p for p in problems if p.file not in unused]
    refused, _ = checked_overrides(overrides, group_options(loaded))
    cfg, option = session.cfg, session.strategy_option
    judged = built_groups(cfg, ("model", "topology", "storage"))
    storage = judged["storage"]
    if (
        any(p.file not in unused for p in loaded.sources.problems)
        or refused
        or unknown_keys(cfg)
        or rule_problems(cfg.strategy)
        or strategy_stage_problems(cfg)
        or judged["model"].problems
        or judged["topology"].problems
        or storage.obj is None
        or "storage.kind" in storage.stand_ins
    ):
        raise ConfigError(problems)

    def lookup(name: str) -> tuple[list[str], str | None]:
        node = cfg.strategy if name == option else session.with_strategy(name).strategy
        return list(node.requires), node.fallback

    model, topology = judged["model"].obj, judged["topology"].obj
    chain = chain_of(option, topology, model, storage.obj, lookup)
    try:
        costs = session.pick or ranking(cfg, session.with_strategy)
    except ConfigError:  # its problems are the config's own, listed in `problems`
        costs = None
    auto = session.pick is not None
    said = tuple(n for n in (session.links_note, session.auto_note) if n is not None)
    chain = dataclasses.replace(chain, notes=(*chain.notes, *said))
    return Explanation(chain, tuple(problems), model, topology, bool(cfg.strict), costs, auto)


def unused_files(loaded: Configs, session: Session) -> set[str]:
    """The folder's option files this config does not read: options no group chose, but for
    the chosen strategy's fallbacks and, with strategy=auto, every strategy (its candidates)."""
    auto = session.pick is not None or session.strategy_option == AUTO
    used = {*session.choices.items(), *(("strategy", s) for s in fallbacks(session))}
    return {
        o.path
        for o in loaded.sources.user
        if (o.group, o.name) not in used and not (auto and o.group == "strategy")
    }


def fallbacks(session: Session) -> set[str]:
    """Every strategy option the chosen one may fall back to, in turn."""
    found: set[str] = set()
    option = session.cfg.strategy.fallback
    while option is not None and option not in found:
        found.add(str(option))
        try:
            option = session.with_strategy(str(option)).strategy.fallback
        except ConfigError:  # no such option: the chain's own problem, which explain lists
            break
    return found
