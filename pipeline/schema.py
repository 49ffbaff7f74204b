"""Typed schemas of the config tree, registered in Hydra's ConfigStore.

Every YAML option starts with `defaults: [base_<group>]`, so composing it checks types, enum choices
and unknown keys against these dataclasses. Required fields are MISSING. Each field's one-line doc
is the string literal under it (an attribute docstring; `tests/unit/test_schema.py` insists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from pipeline.topology import IoBackend, ModelGeometry, Topology


class Ownership(Enum):
    replicated = "replicated"
    single_source = "single_source"
    rotating = "rotating"


class Ordering(Enum):
    gate = "gate"
    forward_stream = "forward_stream"


class Placement(Enum):
    contiguous = "contiguous"
    fragmented = "fragmented"


class Backend(Enum):
    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class PipelineConfig:
    prepare: list[Any] = field(default_factory=list)
    """Stages run once per transfer before any step (localize, issue_chunk)."""
    per_step: list[Any] = field(default_factory=list)
    """Stages run for every step on the transfer stream (copy)."""
    exchange: list[Any] = field(default_factory=list)
    """Stages run for every step after per_step: on the transfer stream with ordering=gate, on
    the consumer's stream at wait(layer) with ordering=forward_stream."""
    finish: list[Any] = field(default_factory=list)
    """Stages run once after the last step (record_event, verify)."""


@dataclass
class IdleSyncSkipConfig:
    enabled: bool = False
    """Skip the per-poll MIN all-reduce while no ack is outstanding (and no storage backend)."""
    max_skips: int = 8
    """After this many consecutive skips one sync is forced (and checks replicated state)."""

    def __post_init__(self) -> None:
        _require_at_least("strategy.idle_sync_skip", self, max_skips=1)


@dataclass
class StrategyConfig:
    name: str = MISSING
    """Strategy name, shown in reports and used as a fallback target."""
    ownership: Ownership = MISSING
    """Which rank of the replica group moves each layer."""
    requires: list[str] = field(default_factory=list)
    """Eligibility rules that must all pass for this strategy to be active."""
    fallback: str | None = None
    """Strategy option used when a required rule fails; null means none (always active)."""
    backup: PipelineConfig = field(default_factory=PipelineConfig)
    """Stages of a backup (device -> host)."""
    load: PipelineConfig = field(default_factory=PipelineConfig)
    """Stages of a load-back (host -> device)."""
    chunk_pages: int = 0
    """Issue the backup in batches of this many pages; 0 issues one batch."""
    keep_capacity: bool = False
    """Sharded host pools keep the unsharded token capacity and use less memory instead."""
    staging_bytes: int = 128 * 1024 * 1024
    """Largest staging buffer of one gather/broadcast/scatter (bigger layers go in chunks), and
    the most one chunked-backup batch moves (each of its two batch buffers at most this)."""
    verify_every: int = 0
    """Every N loads, all-gather digests of the loaded pages and compare them; 0 is off."""
    ordering: Ordering = Ordering.gate
    """How broadcasts stay ordered against the forward's collectives."""
    idle_sync_skip: IdleSyncSkipConfig = field(default_factory=IdleSyncSkipConfig)
    """Leave out the ack poll's collective while nothing is in flight."""
    poll_timer_every: int = 0
    """Log the mean time spent in poll() every N polls; 0 is off."""
    cuda_graphs: int = 8
    """On cuda with io_backend=kernel, a gated transfer (every backup; loads with
    ordering=gate) replays a CUDA graph of its copies and exchanges, captured on the first
    transfer of its page count; this many page counts are kept (0: always issue stage by
    stage)."""

    def __post_init__(self) -> None:
        _require_at_least(
            "strategy",
            self,
            chunk_pages=0,
            staging_bytes=1,
            verify_every=0,
            poll_timer_every=0,
            cuda_graphs=0,
        )


@dataclass
class WorkloadConfig:
    num_tokens: int = MISSING
    """Tokens moved per backup and per load-back."""
    placement: Placement = Placement.contiguous
    """contiguous: first free pages; fragmented: random page ids on both sides."""
    cycles: int = 1
    """Rounds of backup -> evict -> load-back."""
    seed: int = 0
    """Seed of the pool contents and of fragmented placement."""
    device_tokens: int = MISSING
    """Device KV pool size in tokens (logical slots)."""
    host_ratio: float = 2.0
    """Host budget = host_ratio x the device pool's bytes (a serving engine's hicache ratio)."""


@dataclass
class RuntimeConfig:
    backend: Backend = Backend.auto
    """Process-group backend: auto picks nccl on cuda, gloo on cpu."""
    timeout_s: float = 120.0
    """Collective and rank-join timeout."""
    trace_file: str | None = None
    """Write the op trace of every rank here as JSON lines; null writes none."""
    debug_consensus: bool = False
    """All-gather the inputs of every rank-replicated decision and raise on divergence."""


@dataclass
class BenchConfig:
    sizes: list[int] = field(default_factory=lambda: [16384, 65536])
    """Tokens per transfer, one set of cases per size."""
    placements: list[Placement] = field(
        default_factory=lambda: [Placement.contiguous, Placement.fragmented]
    )
    """Page placements to measure."""
    strategies: list[str] = field(
        default_factory=lambda: ["replicated", "single_source", "rotating"]
    )
    """Strategy options to put side by side (each also gets a hand-written reference loop)."""
    contiguous_io: list[IoBackend] = field(
        default_factory=lambda: [IoBackend.direct, IoBackend.kernel]
    )
    """io backends for contiguous placement (direct pairs with page_first_direct, kernel with
    layer_first)."""
    fragmented_io: list[IoBackend] = field(default_factory=lambda: [IoBackend.kernel])
    """io backends for fragmented placement."""
    chunk_pages: list[int] = field(default_factory=lambda: [0, 16])
    """strategy.chunk_pages settings to compare (0: the backup issued as one batch)."""
    cuda_graphs: list[int] = field(default_factory=lambda: [0, 8])
    """strategy.cuda_graphs settings to compare for the kernel backend (0: issued stage by
    stage; direct transfers are never graphed and run once)."""
    repeats: int = 10
    """Timed repetitions per case; the median is reported."""
    warmup: int = 3
    """Untimed repetitions before the timed ones."""
    floor_bytes: int = 1 << 30
    """Bytes per copy/broadcast when measuring the link floors."""
    out_dir: str = "bench_out"
    """Where bench.json, bench.md and bench.png go."""


class IdlePredicate(Enum):
    ledger = "ledger"
    event_status = "event_status"


@dataclass
class SimulateConfig:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Scheduler seeds; each runs with the idle-sync skip off, then on."""
    steps: int = 300
    """Scheduler steps per run (one ack poll each)."""
    arrive_prob: float = 0.3
    """Chance that a request arrives in a step."""
    num_prefixes: int = 12
    """Distinct prefixes requests draw from (hits load back, misses prefill and back up)."""
    max_pages: int = 4
    """Largest request, in pages."""
    max_jitter_polls: int = 3
    """Each ack fires on each rank after up to this many extra polls (rank-local jitter)."""
    max_skips: int = 8
    """Consecutive skips before a forced sync."""
    predicate: IdlePredicate = IdlePredicate.ledger
    """The skip decision's input: ledger (right) or event_status (the negative control)."""
    debug_consensus: bool = True
    """All-gather the skip decision's inputs every poll and raise on divergence."""


@dataclass
class Config:
    model: ModelGeometry = MISSING
    """The model whose KV cache moves."""
    topology: Topology = MISSING
    """The deployment's parallel layout and cache backends."""
    strategy: StrategyConfig = MISSING
    """Who moves which layer, and the stage lists that move it."""
    workload: WorkloadConfig = MISSING
    """What `run` and `plan` move."""
    runtime: RuntimeConfig = MISSING
    """Process groups and timeouts."""
    bench: BenchConfig = MISSING
    """What `bench` measures."""
    simulate: SimulateConfig = MISSING
    """What `simulate` drives."""
    strict: bool = False
    """Refuse to run (and make explain exit 1) when the requested strategy is inactive."""


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelGeometry,
    "topology": Topology,
    "strategy": StrategyConfig,
    "workload": WorkloadConfig,
    "runtime": RuntimeConfig,
    "bench": BenchConfig,
    "simulate": SimulateConfig,
}


def _require_at_least(section: str, obj: object, **floors: int) -> None:
    """Range checks of integer knobs: ValueError naming the key and the least value."""
    for name, least in floors.items():
        value = getattr(obj, name)
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            raise ValueError(f"{section}.{name}={value} must be >= {least}")


def register_schemas() -> None:
    """Store `base_config` and one `base_<group>` per group (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)
