"""One composed config -> its `Job`, and every problem on the way, not the first.

Unknown keys, each group's types and range checks (`build`), the stage lists, the strategy's
rule names, its verdict and the rules that join groups are all checked in one pass; a group
with a mistake takes part in the later checks with stand-ins (see `build`), and a problem that
only a stand-in caused is dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.config.assemble import assemble, stage_problems
from pipeline.config.build import Built, built
from pipeline.config.costs import dedup_note
from pipeline.config.eligibility import RULES, Verdict, decide
from pipeline.config.job import Job, alignment_problems, job_problems
from pipeline.config.layouts import normalize
from pipeline.config.links import links_problems
from pipeline.config.ranges import port_problems, range_problems
from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.config.schema_check import not_a_field
from pipeline.core.checks import ConfigError, Problem

DIRECTIONS = ("backup", "load", "l3")
Sibling = Callable[[str], DictConfig]
"""The same config with another strategy option (a fallback's)."""


def built_groups(cfg: DictConfig, groups: tuple[str, ...] = tuple(GROUP_SCHEMAS)) -> dict:
    """Every group's `Built` (object, problems, stand-ins)."""
    return {g: built(cfg[g], GROUP_SCHEMAS[g], g) for g in groups}


def strategy_stage_problems(cfg: DictConfig) -> list[Problem]:
    """Every problem of the stage lists of the config's strategy."""
    plain: Any = {d: OmegaConf.to_container(cfg.strategy[d], resolve=True) for d in DIRECTIONS}
    return stage_problems(plain, OmegaConf.select(cfg, "strategy.ownership", default=None))


def unknown_keys(node: DictConfig, path: str = "") -> list[Problem]:
    """Keys that a typed node's schema does not declare (`+key=` can sneak them in)."""
    schema = OmegaConf.get_type(node)
    if schema is None or not dataclasses.is_dataclass(schema):
        return []
    declared = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key in map(str, node):
        full = f"{path}.{key}" if path else key
        if key not in declared:
            found.append(not_a_field(full, schema))
        elif isinstance(node._get_node(key), DictConfig):
            found += unknown_keys(node[key], full)
    return found


def rule_problems(strategy: DictConfig) -> list[Problem]:
    """Rule names a strategy requires that no rule has."""
    unknown = [r for r in strategy.requires if r not in RULES]
    if not unknown:
        return []
    message = f"strategy.requires: unknown rules {unknown}; known rules: {sorted(RULES)}"
    return [Problem("strategy.requires", message)]


def verdict_of(
    cfg: DictConfig, option: str, groups: dict[str, Built], sibling: Sibling
) -> tuple[Verdict | None, list[Problem]]:
    """Is strategy `option` active here, and what runs instead (None when the groups it reads
    are broken, or a fallback is)."""

    def lookup(name: str) -> tuple[list[str], str | None]:
        node = cfg.strategy if name == option else sibling(name).strategy
        return list(node.requires), node.fallback

    if any(groups[g].obj is None for g in ("model", "topology", "storage")):
        return None, []
    try:
        topology, model = groups["topology"].obj, groups["model"].obj
        return decide(option, topology, model, groups["storage"].obj, lookup), []
    except ConfigError as e:  # a fallback option that does not compose
        return None, e.problems
    except ValueError as e:  # a fallback chain that ends nowhere
        return None, [Problem("strategy.fallback", str(e))]


def job_of(
    cfg: DictConfig, option: str, sibling: Sibling, notes: tuple[str, ...] = ()
) -> tuple[Job | None, list[Problem], Verdict | None]:
    """(the Job or None, every problem, the verdict or None) of one composed config; `notes`
    join the verdict's (what strategy=auto picked)."""
    found = unknown_keys(cfg) + rule_problems(cfg.strategy)
    groups = built_groups(cfg)
    found += [p for b in groups.values() for p in b.problems]
    found += range_problems(cfg, {p.key for p in found})
    if groups["runtime"].obj is not None:  # a link file is read, and checked, before any run
        found += links_problems(groups["runtime"].obj.links)
    if groups["runtime"].obj is not None and groups["topology"].obj is not None:
        found += port_problems(groups["runtime"].obj.metrics_port, groups["topology"].obj)
    if any(p.key == "strategy.requires" for p in found):  # no verdict reads unknown rules
        return None, found, None
    verdict, problems = verdict_of(cfg, option, groups, sibling)
    found += problems
    if verdict is not None and notes:
        verdict = dataclasses.replace(verdict, notes=verdict.notes + notes)
    if verdict is None:  # no strategy to check against: the whole-page rules still hold
        stood = {k for b in groups.values() for k in b.stand_ins}
        return None, list(dict.fromkeys(found + page_problems(groups, stood))), None
    if not verdict.active:
        try:
            cfg = sibling(verdict.effective_strategy)
        except ConfigError as e:
            return None, found + e.problems, verdict
        groups = {**groups, **built_groups(cfg, ("strategy",))}
        found += list(groups["strategy"].problems)
    typed_strategy = groups["strategy"]
    if (
        typed_strategy.obj is not None
        and not typed_strategy.problems
        and (warning := dedup_note(cfg, typed_strategy.obj, sibling))
    ):  # advice, not a refusal: the run's report says it
        verdict = dataclasses.replace(verdict, notes=(*verdict.notes, warning))
    stages = strategy_stage_problems(cfg)
    stood = {k for b in groups.values() for k in b.stand_ins}
    if stages or any(b.obj is None for b in groups.values()):  # no Job: the page rules only
        joined = page_problems(groups, stood)
        return None, list(dict.fromkeys(found + stages + joined)), verdict
    job = typed_job(groups, verdict, bool(cfg.strict))
    joined = job_problems(job) if not stood else page_problems(groups, stood)
    found = list(dict.fromkeys(found + joined))  # a knob both strategies share: said once
    return (None if found else job), found, verdict


PAGES = {"model.page_size", "topology.dcp_size"}
"""What the whole-page rules read besides the sizes they check."""


def page_problems(groups: dict[str, Built], stood: set[str]) -> list[Problem]:
    """The whole-page rules, where what they read is the user's own (with stand-ins elsewhere,
    the pools' sizes wait: they read every group)."""
    read = [groups[g].obj for g in ("model", "topology", "workload", "bench")]
    if stood & PAGES or any(obj is None for obj in read):
        return []
    return [p for p in alignment_problems(*read) if p.key not in stood]


def typed_job(groups: dict[str, Built], verdict: Verdict, strict: bool) -> Job:
    """The Job of built groups: the strategy's stages instantiated, the topology normalized."""
    topology, _ = normalize(groups["topology"].obj)
    return Job(
        model=groups["model"].obj,
        topology=topology,
        strategy=assemble(groups["strategy"].obj),
        workload=groups["workload"].obj,
        runtime=groups["runtime"].obj,
        bench=groups["bench"].obj,
        simulate=groups["simulate"].obj,
        soak=groups["soak"].obj,
        storage=groups["storage"].obj,
        events=groups["events"].obj,
        verdict=verdict,
        strict=strict,
    )
