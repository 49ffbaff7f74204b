"""Schemas of what `bench`, `simulate` and `soak` drive (the rest of the job-side groups are
in `schema`; the same rules hold: each field's doc is the string under it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from pipeline.core.checks import Problem, at_least, non_empty, raise_problems
from pipeline.core.storage import StorageKind
from pipeline.core.topology import IoBackend


class Placement(Enum):
    """Where a transfer's pages lie in the pools."""

    contiguous = "contiguous"
    fragmented = "fragmented"


class PageCache(Enum):
    """Whether the L3 bench reads a file store's objects from the OS page cache (warm: read
    back right after they were written) or after asking the OS to drop them (cold)."""

    warm = "warm"
    cold = "cold"


class BenchKind(Enum):
    """What `bench` measures: transfers (strategies against a hand loop and the link floors;
    with `bench.stores`, load-backs from L3), links (this machine's link speeds, for the cost
    model's `runtime.links`), ttft (a prefix hit's time to first token against recompute)."""

    transfers = "transfers"
    links = "links"
    ttft = "ttft"


class IdlePredicate(Enum):
    """What `simulate`'s idle-sync skip decision reads."""

    ledger = "ledger"
    event_status = "event_status"


@dataclass(kw_only=True)
class BenchConfig:
    """What `bench` measures."""

    kind: BenchKind = BenchKind.transfers
    """transfers (strategies against a hand-written loop and the link floors; with
    bench.stores, load-backs from L3), links (this machine's link speeds, for runtime.links)
    or ttft (a prefix hit's time to first token against recomputing the prefix)."""
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
    new_tokens: list[int] = field(default_factory=lambda: [128, 1024, 8192])
    """The ttft bench's new (uncached) tokens per request, one row each."""

    def __post_init__(self) -> None:
        found = at_least("bench", self, repeats=1, warmup=0, floor_bytes=1)
        found += non_empty(
            "bench",
            self,
            "sizes",
            "placements",
            "strategies",
            "chunk_pages",
            "cuda_graph_cache",
            "new_tokens",
        )
        for name, values, least in (
            ("sizes", self.sizes, 1),
            ("chunk_pages", self.chunk_pages, 0),
            ("cuda_graph_cache", self.cuda_graph_cache, 0),
            ("new_tokens", self.new_tokens, 1),
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
