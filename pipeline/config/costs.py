"""The cost model over a composed config: an estimate for every strategy option, which are
active here, and the winner `strategy=auto` runs (the fastest active one), with its reason.

`ranking(cfg, sibling)` is the config layer's one call; `case_of` turns typed groups into the
model's plain `Case` (the benches build theirs the same way). Estimates are of the workload
(`workload.num_tokens`, `workload.placement`) on the normalized topology, with the links of
`runtime.links`; with a store, `strategy=auto` compares loads from L3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from pipeline.config.build import built
from pipeline.config.drive_schemas import Placement
from pipeline.config.eligibility import RuleResult, dedup_expected_to_win, evaluate
from pipeline.config.layouts import normalize
from pipeline.config.links import links_of
from pipeline.config.schema import GROUP_SCHEMAS, RuntimeConfig, WorkloadConfig
from pipeline.config.sources import shipped_options
from pipeline.core.checks import ConfigError, Problem, raise_problems
from pipeline.core.cost import Case, Estimate, Links, estimate
from pipeline.core.model import ModelGeometry
from pipeline.core.ownership import Ownership
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.strategy import StrategyConfig
from pipeline.core.topology import DeviceKind, Topology

AUTO = "auto"
"""The strategy option that runs the winner (conf/strategy/auto.yaml is replicated's
stages, which run only where no estimate can be made)."""
DEVICE_LINKS = {DeviceKind.cpu: "cpu"}
"""The links preset a device prices with where `runtime.links` keeps its default (the H200
host's, which says nothing of a CPU run)."""
Sibling = Callable[[str], DictConfig]


@dataclass(frozen=True)
class Candidate:
    """One strategy option: whether it is active here, and its estimate."""

    option: str
    active: bool
    failed: tuple[str, ...]
    """The rules it fails here."""
    estimate: Estimate

    def as_dict(self) -> dict[str, object]:
        return {"strategy": self.option, "active": self.active, **self.estimate.as_dict()}


@dataclass(frozen=True)
class Ranking:
    """Every strategy option's estimate on one config, and the winner."""

    links: Links
    case: Case
    candidates: tuple[Candidate, ...]

    @property
    def winner(self) -> Candidate:
        """The active option with the least load-back (ties: the first, replicated first)."""
        return min((c for c in self.candidates if c.active), key=lambda c: c.estimate.score)

    def of(self, option: str) -> Candidate | None:
        return next((c for c in self.candidates if c.option == option), None)

    @property
    def measure(self) -> str:
        return "load from L3" if self.case.store is not StorageKind.none else "load-back"

    def reason(self) -> str:
        """Why the winner wins, in one line."""
        w = self.winner
        others = [
            f"{c.option} {c.estimate.score * 1e3:.2f} ms"
            for c in self.candidates
            if c.active and c is not w
        ]
        against = f" against {', '.join(others)}" if others else " the only active strategy"
        leg = w.estimate.l3_load or w.estimate.load
        return (
            f"estimated {self.measure} {w.estimate.score * 1e3:.2f} ms, bound by {leg.bound};"
            f"{against} (links {self.links.machine})"
        )

    def warning(self, option: str) -> RuleResult | None:
        """The dedup rule for the option that runs (None for replicated or a lone rank)."""
        mine, baseline = self.of(option), self.of("replicated")
        if mine is None or baseline is None or mine.estimate.ownership is Ownership.replicated:
            return None
        return dedup_expected_to_win(option, mine.estimate, baseline.estimate, self.case)

    def as_dict(self) -> dict[str, object]:
        return {
            "links": self.links.machine,
            "measure": self.measure,
            "strategies": [c.as_dict() for c in self.candidates],
            "winner": self.winner.option,
            "reason": self.reason(),
        }


def case_of(
    model: ModelGeometry,
    topology: Topology,
    workload: WorkloadConfig,
    storage: StorageConfig,
    graph_cache: int,
) -> Case:
    """The model's Case of a run's workload (the topology normalized as the engine runs it;
    graphs as on cuda, where strategy.cuda_graph_cache > 0 replays them)."""
    normalized, _ = normalize(topology)
    window = storage.load_chunk_pages
    return Case(
        model=model,
        topology=normalized,
        tokens=workload.num_tokens,
        fragmented=workload.placement is Placement.fragmented,
        graphs=graph_cache > 0,
        store=storage.kind,
        window_pages=64 if window is None else window,  # the cuda default (see storage)
    )


def device_links(cfg: DictConfig, named: set[str]) -> tuple[str, str] | None:
    """(preset, why) where the device prices with its own links: `runtime.links` at its
    default, not named on the command line (`named`: the keys the overrides set), on a
    device with a preset of its own. None: runtime.links stands."""
    default = RuntimeConfig().links
    preset = DEVICE_LINKS.get(cfg.topology.device)
    if preset is None or cfg.runtime.links != default or "runtime.links" in named:
        return None
    device = cfg.topology.device.value
    why = (
        f"runtime.links={preset}: topology.device={device}, and the default {default} preset "
        f"prices an H200 host (runtime.links={default} on the command line keeps it)"
    )
    return preset, why


def strategy_options() -> list[str]:
    """The strategy options auto chooses among: the shipped ones, replicated first, then the
    user's (those registered for this command), each once (ties go to the first)."""
    shipped = sorted(shipped_options()["strategy"] - {AUTO}, key=lambda n: (n != "replicated", n))
    loader = GlobalHydra.instance().config_loader()
    known = loader.get_group_options("strategy")
    users = sorted(n for n in known if n not in shipped and n != AUTO and not n.startswith("base_"))
    return shipped + users


def typed_groups(cfg: DictConfig) -> dict[str, object]:
    """The groups an estimate reads, typed (ConfigError with every problem of them)."""
    found: list[Problem] = []
    groups: dict[str, object] = {}
    for g in ("model", "topology", "workload", "storage", "runtime"):
        b = built(cfg[g], GROUP_SCHEMAS[g], g)
        found += b.problems
        groups[g] = b.obj
    raise_problems(found)
    return groups


def ranking(cfg: DictConfig, sibling: Sibling) -> Ranking:
    """Every strategy option's estimate for this config (ConfigError where one cannot be
    made: a group the estimate reads has a mistake, or runtime.links does not read)."""
    g = typed_groups(cfg)
    model, topology, storage = g["model"], g["topology"], g["storage"]
    assert isinstance(model, ModelGeometry) and isinstance(topology, Topology)
    assert isinstance(storage, StorageConfig) and isinstance(g["workload"], WorkloadConfig)
    links = links_of(str(cfg.runtime.links))
    case = case_of(model, topology, g["workload"], storage, int(cfg.strategy.cuda_graph_cache))
    candidates = []
    for option in strategy_options():
        try:
            node = sibling(option).strategy
            rules = evaluate(list(node.requires), case.topology, model, storage)
        except (ConfigError, ValueError):  # a user's option with a mistake: validate says it
            continue
        failed = tuple(r.name for r in rules if not r.passed)
        ownership = Ownership(node.ownership)
        candidates.append(Candidate(option, not failed, failed, estimate(case, ownership, links)))
    if not any(c.active for c in candidates):
        raise ConfigError([Problem("strategy", "no strategy option is active here")])
    return Ranking(links, case, tuple(candidates))


def dedup_note(cfg: DictConfig, strategy: StrategyConfig, sibling: Sibling) -> str | None:
    """The dedup rule's warning for the strategy this config runs, as a verdict note (None
    where it passes, the strategy is replicated, replicated cannot run here, or no estimate
    can be made: a group it reads has a mistake, which the job reports)."""
    ownership = strategy.ownership
    if ownership is Ownership.replicated:
        return None
    try:
        g = typed_groups(cfg)
        model, storage = g["model"], g["storage"]
        assert isinstance(model, ModelGeometry) and isinstance(storage, StorageConfig)
        assert isinstance(g["topology"], Topology) and isinstance(g["workload"], WorkloadConfig)
        case = case_of(
            model, g["topology"], g["workload"], storage, int(cfg.strategy.cuda_graph_cache)
        )
        requires = list(sibling("replicated").strategy.requires)
        links = links_of(str(cfg.runtime.links))
    except ConfigError:
        return None
    if not all(r.passed for r in evaluate(requires, case.topology, model, storage)):
        return None
    mine, theirs = (estimate(case, o, links) for o in (ownership, Ownership.replicated))
    rule = dedup_expected_to_win(strategy.name, mine, theirs, case)
    return None if rule.passed else f"WARN {rule.name}: {rule.message}"
