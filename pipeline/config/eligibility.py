"""Named eligibility rules and the verdict: is a strategy active for this topology, and why not.

A rule is a pure function of (Topology, ModelGeometry, StorageConfig) returning whether it passed
and a message; a failed rule's message names the fix. Every rule of a strategy is evaluated, and
of each fallback tried after it (never stopping at the first failure), so one `explain` shows
everything a user has to change, even where no strategy of the chain is active.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.config.layouts import normalize
from pipeline.core.cost import Case, Estimate
from pipeline.core.model import KvDtype, ModelGeometry, ModelKind
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import DisaggregationMode, IoBackend, MemLayout, Topology


@dataclass(frozen=True)
class RuleResult:
    """The outcome of one named rule."""

    name: str
    passed: bool
    message: str


@dataclass(frozen=True)
class Verdict:
    """Whether the requested strategy is active, what runs instead, and every reason."""

    strategy: str
    active: bool
    effective_strategy: str
    rules: tuple[RuleResult, ...]
    notes: tuple[str, ...]

    def as_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "active": self.active,
            "effective_strategy": self.effective_strategy,
            "rules": [dataclasses.asdict(r) for r in self.rules],
            "notes": list(self.notes),
        }


Check = Callable[[Topology, ModelGeometry, StorageConfig], tuple[bool, str]]


def _attn_tp_gt_1(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.attn_tp_size > 1:
        return True, f"attention-TP size is {t.attn_tp_size}"
    return False, (
        f"attention-TP size is {t.attn_tp_size}: no peer holds the same bytes; raise "
        "topology.tp_size (or lower topology.dp_size / attn_cp_size)"
    )


def _no_attn_cp(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.attn_cp_size == 1:
        return True, "no attention context parallelism"
    return False, f"attn_cp_size={t.attn_cp_size} splits tokens over ranks; set attn_cp_size=1"


def _no_dcp(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.dcp_size == 1:
        return True, "no decode context parallelism"
    return False, f"dcp_size={t.dcp_size} shards KV slots over ranks; set dcp_size=1"


def _single_pp_stage(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.pp_size == 1:
        return True, "one pipeline stage"
    return False, f"pp_size={t.pp_size}: layer owners are defined per stage; set pp_size=1"


def _single_node(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.nnodes == 1:
        return True, "one node"
    return False, (
        f"nnodes={t.nnodes}: per-layer broadcasts would cross the inter-node network; "
        "set nnodes=1 or use single_source"
    )


def _mem_layout_supported(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.io_backend is IoBackend.kernel or t.mem_layout is MemLayout.page_first_direct:
        return True, f"mem_layout={t.mem_layout.value} with io_backend={t.io_backend.value}"
    return False, (
        f"mem_layout={t.mem_layout.value} with io_backend=direct: sharded host pools need "
        "page_first_direct (or page_first) with direct; set topology.mem_layout=page_first_direct "
        "or topology.io_backend=kernel"
    )


def _readers_reach_store(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if s.kind is not StorageKind.file:
        return True, f"storage={s.kind.value}: every rank reaches the same store"
    if t.nnodes == 1:
        return True, "storage=file on one node: every rank reads the folder the writer wrote"
    return False, (
        f"storage=file is a folder on one machine's disk, but the ranks span {t.nnodes} nodes: "
        "a rank would look for objects that a rank of another node wrote, and never find them; "
        "use storage=mooncake, or single_source (whose one reader is also the writer)"
    )


def _not_pd_decode(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if t.disaggregation_mode is not DisaggregationMode.decode:
        return True, f"disaggregation_mode={t.disaggregation_mode.value}"
    return False, (
        "disaggregation_mode=decode receives KV from prefill servers per rank; "
        "use rotating on the prefill server or set disaggregation_mode=none"
    )


def _mla_pool(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if m.kind is ModelKind.mla:
        return True, f"{m.name} has an MLA pool (every attention-TP rank holds the same bytes)"
    return False, f"{m.name} is {m.kind.value}: KV heads differ per rank; use an MLA model"


def _mla_not_fp4(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if m.kv_dtype is not KvDtype.fp4:
        return True, f"kv_dtype={m.kv_dtype.value}"
    return False, "kv_dtype=fp4 pools keep scales apart from the data; use fp8 or bf16 KV"


def _layers_ge_group(t: Topology, m: ModelGeometry, s: StorageConfig) -> tuple[bool, str]:
    if m.num_layers >= t.attn_tp_size:
        return True, f"{m.num_layers} layers >= group of {t.attn_tp_size}"
    return False, (
        f"{m.num_layers} layers < group of {t.attn_tp_size}: some ranks would own no layer; "
        f"use a smaller attention-TP group or single_source, or (a tiny model on CPU ranks) "
        f"model.num_layers={t.attn_tp_size}"
    )


RULES: Mapping[str, Check] = MappingProxyType(
    {
        "attn_tp_gt_1": _attn_tp_gt_1,
        "no_attn_cp": _no_attn_cp,
        "no_dcp": _no_dcp,
        "single_pp_stage": _single_pp_stage,
        "single_node": _single_node,
        "mem_layout_supported": _mem_layout_supported,
        "readers_reach_store": _readers_reach_store,
        "not_pd_decode": _not_pd_decode,
        "mla_pool": _mla_pool,
        "mla_not_fp4": _mla_not_fp4,
        "layers_ge_group": _layers_ge_group,
    }
)


def evaluate(
    requires: list[str], topology: Topology, model: ModelGeometry, storage: StorageConfig
) -> list[RuleResult]:
    """Run every named rule; unknown names raise ValueError listing the known ones."""
    unknown = [name for name in requires if name not in RULES]
    if unknown:
        raise ValueError(f"unknown eligibility rules {unknown}; known rules: {sorted(RULES)}")
    return [RuleResult(name, *RULES[name](topology, model, storage)) for name in requires]


StrategyLookup = Callable[[str], tuple[list[str], str | None]]
"""Maps a strategy option name to (its required rules, its fallback)."""


@dataclass(frozen=True)
class Tried:
    """One strategy of a fallback chain, with the verdict of each of its rules."""

    strategy: str
    rules: tuple[RuleResult, ...]

    @property
    def active(self) -> bool:
        return all(r.passed for r in self.rules)

    def as_dict(self) -> dict:
        rules = [dataclasses.asdict(r) for r in self.rules]
        return {"strategy": self.strategy, "active": self.active, "rules": rules}


@dataclass(frozen=True)
class Chain:
    """The requested strategy and each fallback tried after it, up to the first active one."""

    tried: tuple[Tried, ...]
    effective: str | None
    """The first active strategy; None when the chain ends at an inactive strategy without a
    fallback, or loops (`dead_end` says which)."""
    notes: tuple[str, ...]
    dead_end: str | None = None


def chain_of(
    name: str,
    topology: Topology,
    model: ModelGeometry,
    storage: StorageConfig,
    lookup: StrategyLookup,
) -> Chain:
    """Every rule of `name`, then of each fallback in turn until one is active (the layout
    normalizations first, said in the notes)."""
    normalized, notes = normalize(topology)
    tried: list[Tried] = []
    current = name
    while True:
        requires, fallback = lookup(current)
        tried.append(Tried(current, tuple(evaluate(requires, normalized, model, storage))))
        if tried[-1].active:
            return Chain(tuple(tried), current, notes)
        if fallback is None:
            reasons = "; ".join(f"{r.name}: {r.message}" for r in tried[-1].rules if not r.passed)
            why = f"strategy {current!r} is inactive and names no fallback ({reasons})"
            return Chain(tuple(tried), None, notes, why)
        if fallback in (t.strategy for t in tried):
            cycle = " -> ".join([*(t.strategy for t in tried), fallback])
            return Chain(tuple(tried), None, notes, f"fallback cycle: {cycle}")
        notes += (f"{current} is inactive: falling back to {fallback}",)
        current = fallback


def decide(
    name: str,
    topology: Topology,
    model: ModelGeometry,
    storage: StorageConfig,
    lookup: StrategyLookup,
) -> Verdict:
    """The verdict for strategy `name`: the first active strategy of its fallback chain
    (ValueError naming the dead end when there is none)."""
    chain = chain_of(name, topology, model, storage, lookup)
    if chain.effective is None:
        raise ValueError(chain.dead_end)
    first = chain.tried[0]
    return Verdict(name, first.active, chain.effective, first.rules, chain.notes)


def dedup_expected_to_win(
    name: str, mine: Estimate, replicated: Estimate, case: Case
) -> RuleResult:
    """A warning, not a gate: does the cost model expect deduplicating strategy `name` to
    load faster than replicated here, and if not, what to change."""
    rule = "dedup_expected_to_win"
    ours, theirs = mine.score, replicated.score
    if ours < theirs:
        return RuleResult(
            rule, True, f"{name} {ours * 1e3:.2f} ms < replicated {theirs * 1e3:.2f} ms"
        )
    leg = mine.l3_load or mine.load
    group = len(case.topology.replica_group(0, case.model))
    why = {
        "l3 read": "one reader is the bottleneck (the rest wait for its reads)",
        "broadcast": "the broadcast is slower than each rank's own copy"
        + (" (the group spans nodes)" if case.topology.nnodes > 1 else ""),
        "h2d kernel": "UVA kernel copies do not overlap the broadcasts",
    }.get(leg.bound, f"it is bound by {leg.bound}")
    if group <= 2:
        why += f"; a group of {group} saves at most half of each rank's bytes"
    fix = (
        "use strategy=replicated or strategy=auto"
        + (
            "; contiguous pages with topology.io_backend=direct let copies overlap the broadcasts"
            if case.fragmented or leg.bound == "h2d kernel"
            else ""
        )
        + (
            "; rotating spreads the reads over the group"
            if leg.bound == "l3 read" and name != "rotating"
            else ""
        )
    )
    message = (
        f"{name} is expected to lose: {ours * 1e3:.2f} ms against replicated's "
        f"{theirs * 1e3:.2f} ms: {why}; {fix}"
    )
    return RuleResult(rule, False, message)
