"""Typed schemas of the config groups that only jobs read, and the root `Config`.

The model, topology and strategy schemas are the spec layer's own dataclasses. Every YAML
option starts with `defaults: [base_<group>]`, so composing it checks types, enum choices and
unknown keys against these; required fields have no default. Range checks run in
`__post_init__`, so `validate` reports them with file and key. Each field's one-line doc is the
string literal under it (`tests/unit/test_schema.py` insists). This module imports no Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from pipeline.engine.runtime import Backend
from pipeline.spec.checks import (
    LARGEST_NUMBER,
    Problem,
    at_least,
    finite,
    non_empty,
    raise_problems,
)
from pipeline.spec.model import ModelGeometry
from pipeline.spec.sizing import parse_bytes
from pipeline.spec.storage import StorageConfig, StorageKind
from pipeline.spec.strategy import StrategyConfig
from pipeline.spec.topology import IoBackend, Topology


class Placement(Enum):
    """Where a transfer's pages lie in the pools."""

    contiguous = "contiguous"
    fragmented = "fragmented"


class PageCache(Enum):
    """Whether the L3 bench reads a file store's objects from the OS page cache (warm: read
    back right after they were written) or after asking the OS to drop them (cold)."""

    warm = "warm"
    cold = "cold"


class IdlePredicate(Enum):
    """What `simulate`'s idle-sync skip decision reads."""

    ledger = "ledger"
    event_status = "event_status"


MAX_TOKENS = 1 << 24
"""The most tokens a workload moves or a device pool holds: 16M tokens of deepseek_v3 are
1.2 TB, beyond any one engine; `plan` of 64M tokens took 95 s and 7 GB of memory."""


@dataclass(kw_only=True)
class WorkloadConfig:
    """What `run` and `plan` move."""

    num_tokens: int
    """Tokens moved per backup and per load-back."""
    placement: Placement = Placement.contiguous
    """contiguous: first free pages; fragmented: random page ids on both sides."""
    cycles: int = 1
    """Rounds of backup -> evict -> load-back."""
    seed: int = 0
    """Seed of the pool contents and of fragmented placement."""
    device_tokens: int
    """Device KV pool size in tokens (logical slots)."""
    host_ratio: float | None = None
    """Host budget = host_ratio x the device pool's bytes (a serving engine's hicache ratio);
    null: 2.0, unless host_bytes gives the budget."""
    host_bytes: str | None = None
    """Host budget of each rank in bytes, instead of host_ratio: an int or a size such as
    64GiB (KiB, MiB...: powers of 1024; KB, MB...: of 1000); null: host_ratio sizes it."""

    def __post_init__(self) -> None:
        found = at_least("workload", self, num_tokens=1, cycles=1, device_tokens=1)
        found += finite("workload", self, "host_ratio")
        for name in ("num_tokens", "device_tokens"):
            value = getattr(self, name)
            if isinstance(value, int) and MAX_TOKENS < value <= LARGEST_NUMBER:
                message = f"workload.{name}={value}: at most {MAX_TOKENS} tokens (2**24)"
                found.append(Problem(f"workload.{name}", message))
        if isinstance(self.host_ratio, int | float) and not found and self.host_ratio <= 0:
            found.append(
                Problem("workload.host_ratio", f"workload.host_ratio={self.host_ratio} must be > 0")
            )
        found += self._host_bytes_problems()
        raise_problems(found)

    def _host_bytes_problems(self) -> list[Problem]:
        key = "workload.host_bytes"
        if self.host_bytes is None:
            return []
        if self.host_ratio is not None:
            message = (
                f"{key} and workload.host_ratio are both set: give one (the host budget in "
                "bytes, or as a ratio of the device pool)"
            )
            return [Problem(key, message)]
        try:
            parse_bytes(str(self.host_bytes))
        except ValueError:
            message = (
                f"{key}={self.host_bytes!r} must be a whole number of bytes from 1 to 1e15, "
                "e.g. 64GiB, 512MiB or 68719476736"
            )
            return [Problem(key, message)]
        return []

    @property
    def host_budget_bytes(self) -> int | None:
        """host_bytes in bytes (None: the budget is a ratio)."""
        return None if self.host_bytes is None else parse_bytes(str(self.host_bytes))

    @property
    def host_key(self) -> str:
        """The key that sizes the host pool: the one a message asks to raise."""
        return "workload.host_ratio" if self.host_bytes is None else "workload.host_bytes"


@dataclass(kw_only=True)
class RuntimeConfig:
    """Process groups and timeouts."""

    backend: Backend = Backend.auto
    """Process-group backend: auto picks nccl on cuda, gloo on cpu."""
    timeout_s: float = 120.0
    """Collective and rank-join timeout."""
    trace_file: str | None = None
    """Write the op trace of every rank here as JSON lines; null writes none."""
    debug_consensus: bool = False
    """All-gather the inputs of every rank-replicated decision and raise on divergence."""

    def __post_init__(self) -> None:
        found = finite("runtime", self, "timeout_s")
        if isinstance(self.timeout_s, int | float) and not found and self.timeout_s <= 0:
            key = "runtime.timeout_s"
            found.append(Problem(key, f"{key}={self.timeout_s} must be > 0"))
        raise_problems(found)


@dataclass(kw_only=True)
class BenchConfig:
    """What `bench` measures."""

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
    """strategy.chunk_pages settings to compare (0: the backup planned as one batch)."""
    cuda_graph_cache: list[int] = field(default_factory=lambda: [0, 8])
    """strategy.cuda_graph_cache settings to compare for the kernel backend (0: issued stage
    by stage; direct transfers are never graphed and run once)."""
    repeats: int = 10
    """Timed repetitions per case; the median is reported."""
    warmup: int = 3
    """Untimed repetitions before the timed ones."""
    floor_bytes: int = 1 << 30
    """Bytes per copy/broadcast when measuring the link floors."""
    out_dir: str = "bench_out"
    """Where bench.json, bench.md and bench.png go."""
    stores: list[StorageKind] = field(default_factory=list)
    """Non-empty: the L3 bench instead (per store and size, load-back from L3 of each strategy
    side by side; writes bench_l3.json and bench_l3.md)."""
    caches: list[PageCache] = field(default_factory=lambda: [PageCache.warm])
    """The L3 bench's page-cache states for the file store (cold: the OS is asked to drop
    the objects before every load)."""

    def __post_init__(self) -> None:
        found = at_least("bench", self, repeats=1, warmup=0, floor_bytes=1)
        found += non_empty(
            "bench", self, "sizes", "placements", "strategies", "chunk_pages", "cuda_graph_cache"
        )
        for name, values, least in (
            ("sizes", self.sizes, 1),
            ("chunk_pages", self.chunk_pages, 0),
            ("cuda_graph_cache", self.cuda_graph_cache, 0),
        ):
            if any(isinstance(v, int) and v < least for v in values):
                key = f"bench.{name}"
                found.append(Problem(key, f"{key}={values} must hold integers >= {least}"))
        raise_problems(found)


@dataclass(kw_only=True)
class SimulateConfig:
    """What `simulate` drives."""

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

    def __post_init__(self) -> None:
        found = at_least(
            "simulate",
            self,
            steps=1,
            num_prefixes=1,
            max_pages=1,
            max_jitter_polls=0,
            max_skips=1,
        )
        found += non_empty("simulate", self, "seeds")
        if isinstance(self.arrive_prob, int | float) and not 0 <= self.arrive_prob <= 1:
            key = "simulate.arrive_prob"
            found.append(Problem(key, f"{key}={self.arrive_prob} must lie in [0, 1]"))
        raise_problems(found)


@dataclass(kw_only=True)
class SoakConfig:
    """What `soak` drives: many rounds, and how much a rank's memory may grow over them."""

    cycles: int = 2000
    """Rounds of backup -> evict -> load-back (each checked bit-exact)."""
    warmup_cycles: int = 200
    """Rounds before the first memory reading (caches and pools settle)."""
    max_rss_growth_mb: float = 5.0
    """Most a rank's resident memory may grow from the first reading to the last."""

    def __post_init__(self) -> None:
        found = at_least("soak", self, cycles=1, warmup_cycles=0, max_rss_growth_mb=0)
        if not found and self.warmup_cycles >= self.cycles:
            message = f"soak.warmup_cycles={self.warmup_cycles} must be < soak.cycles={self.cycles}"
            found.append(Problem("soak.warmup_cycles", message))
        raise_problems(found)


@dataclass(kw_only=True)
class Config:
    """The whole config tree of one invocation."""

    model: ModelGeometry
    """The model whose KV cache moves."""
    topology: Topology
    """The deployment's parallel layout and cache backends."""
    strategy: StrategyConfig
    """Who moves which layer, and the stage lists that move it."""
    workload: WorkloadConfig
    """What `run` and `plan` move."""
    runtime: RuntimeConfig
    """Process groups and timeouts."""
    bench: BenchConfig
    """What `bench` measures."""
    simulate: SimulateConfig
    """What `simulate` drives."""
    soak: SoakConfig
    """What `soak` drives."""
    storage: StorageConfig
    """The L3 store behind the host tier."""
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
    "soak": SoakConfig,
    "storage": StorageConfig,
}
