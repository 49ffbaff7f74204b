"""The range of every numeric knob: the values the code can run, not merely the finite ones.

Each group's dataclass refuses what its own arithmetic cannot take (a page of 0 tokens, a
negative count); this table adds what only running shows (a timeout beyond what a thread can
wait, a seed that overflows torch's generator, a buffer no machine holds). `checked.job_of`
applies it to every composed config, so `validate`, every command and `pipeline.compose`
refuse a value outside it, naming the knob and its range. A test walks every schema and
insists each numeric field has a row here; `ranges_table()` is the reference the docs show.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config.schema import MAX_TOKENS
from pipeline.config.schema_check import shown
from pipeline.core.checks import LARGEST_NUMBER, Problem
from pipeline.core.events import PORT_MAX
from pipeline.core.model import MAX_LAYERS
from pipeline.core.topology import MAX_RANKS, Topology

WEEK_S = 7 * 24 * 3600
"""The longest wait: far below what a thread or a process group can wait (threading's
TIMEOUT_MAX is ~292 years; 1e12 s overflowed), far above any transfer."""
MAX_ROUNDS = 1_000_000
"""Most rounds, steps or repetitions of one command: hours of work, still a finite run."""
MAX_SEED = (1 << 32) - 1
"""Seeds are mixed (seed x 1,000,003 + round x 7919 + rank) into torch's 64-bit generator
seed: 1e15 overflowed it."""
MAX_ROW_BYTES = 1 << 20
"""1 MiB per token per layer: ~900x deepseek_v3's 1152 B; pools and objects multiply it."""
MAX_PAGE_TOKENS = 4096
"""Serving engines page 1 to 256 tokens; an L3 object holds a page of every layer."""
MAX_BUFFER_BYTES = 4 << 30
"""A buffer every rank allocates whole (staging on the device, a floor's copy on host and
device, a Mooncake segment): 4 GiB; 1 TiB failed to allocate once its ranks had started."""


@dataclass(frozen=True)
class Range:
    """The least and most value a knob takes, and why the bound is where it is."""

    least: float
    most: float
    why: str


COUNT = "a count"
RANGES: dict[str, Range] = {
    "model.num_layers": Range(1, MAX_LAYERS, "plans, pools and checks walk every layer"),
    "model.kv_row_bytes": Range(1, MAX_ROW_BYTES, "bytes per token per layer"),
    "model.page_size": Range(1, MAX_PAGE_TOKENS, "tokens per page"),
    "model.indexer.row_bytes": Range(1, MAX_ROW_BYTES, "bytes per token per indexer layer"),
    "model.indexer.layers": Range(0, MAX_LAYERS - 1, "layer numbers"),
    "topology.tp_size": Range(1, MAX_RANKS, "ranks"),
    "topology.dp_size": Range(1, MAX_RANKS, "ranks"),
    "topology.attn_cp_size": Range(1, MAX_RANKS, "ranks"),
    "topology.dcp_size": Range(1, MAX_RANKS, "ranks"),
    "topology.pp_size": Range(1, MAX_RANKS, "ranks"),
    "topology.nnodes": Range(1, MAX_RANKS, "nodes"),
    "strategy.chunk_pages": Range(0, MAX_TOKENS, "pages: a transfer has at most 2**24 tokens"),
    "strategy.load_group_bytes": Range(0, 1 << 40, "bytes: a threshold, no buffer"),
    "strategy.staging_bytes": Range(1, MAX_BUFFER_BYTES, "bytes of a buffer on every rank"),
    "strategy.verify_every": Range(0, MAX_ROUNDS, "loads between checks"),
    "strategy.idle_sync_skip.max_skips": Range(1, MAX_ROUNDS, "polls"),
    "strategy.poll_timer_every": Range(0, MAX_ROUNDS, "polls"),
    "strategy.cuda_graph_cache": Range(0, 1024, "graphs kept, each holding device memory"),
    "workload.num_tokens": Range(1, MAX_TOKENS, "tokens"),
    "workload.cycles": Range(1, MAX_ROUNDS, "rounds"),
    "workload.seed": Range(0, MAX_SEED, "a seed"),
    "workload.device_tokens": Range(1, MAX_TOKENS, "tokens"),
    "workload.host_ratio": Range(0.001, 1000, "x the device pool's bytes"),
    "runtime.timeout_s": Range(0.001, WEEK_S, "seconds: at most a week"),
    "runtime.metrics_port": Range(1, PORT_MAX, "a TCP port, one more per rank"),
    "bench.sizes": Range(1, MAX_TOKENS, "tokens"),
    "bench.chunk_pages": Range(0, MAX_TOKENS, "pages"),
    "bench.cuda_graph_cache": Range(0, 1024, "graphs kept"),
    "bench.repeats": Range(1, MAX_ROUNDS, "repetitions"),
    "bench.warmup": Range(0, MAX_ROUNDS, "repetitions"),
    "bench.floor_bytes": Range(1, MAX_BUFFER_BYTES, "bytes each rank copies, held twice"),
    "bench.new_tokens": Range(1, MAX_TOKENS, "tokens"),
    "simulate.seeds": Range(0, MAX_SEED, "seeds"),
    "simulate.steps": Range(1, MAX_ROUNDS, "steps"),
    "simulate.arrive_prob": Range(0, 1, "a probability"),
    "simulate.num_prefixes": Range(1, MAX_ROUNDS, COUNT),
    "simulate.max_pages": Range(1, MAX_TOKENS, "pages"),
    "simulate.max_jitter_polls": Range(0, 1000, "polls: beyond the run an ack never fires"),
    "simulate.max_skips": Range(1, MAX_ROUNDS, "polls"),
    "soak.cycles": Range(1, MAX_ROUNDS, "rounds"),
    "soak.warmup_cycles": Range(0, MAX_ROUNDS, "rounds"),
    "soak.max_rss_growth_mb": Range(0, 1 << 20, "MB: 1 TiB"),
    "storage.segment_bytes": Range(1 << 20, 1 << 40, "bytes every rank lends the store"),
    "storage.io_threads": Range(1, 64, "threads per rank"),
    "storage.load_chunk_pages": Range(0, MAX_TOKENS, "pages"),
    "storage.stream_layers": Range(0, MAX_LAYERS, "layers"),
    "storage.evict_to": Range(0.01, 1, "a fraction of capacity_bytes"),
    "storage.prefetch_timeout_s": Range(0.001, WEEK_S, "seconds: at most a week"),
    "storage.min_hit_pages": Range(1, MAX_TOKENS, "pages"),
    "events.buffer_steps": Range(1, MAX_ROUNDS, "batches"),
    "events.dp_rank": Range(0, MAX_RANKS - 1, "an engine's data-parallel rank"),
    "events.replay_window": Range(1, 10_000, "batches one replay client may leave unread"),
    "events.replay_clients": Range(1, 10_000, "connections, a descriptor each"),
    "storage.admit_after_hits": Range(1, MAX_ROUNDS, "lookups"),
    "storage.admit_tracked_pages": Range(1, 100_000_000, "pages: about 20 GB of counts"),
    "storage.write_back_queue_pages": Range(0, MAX_TOKENS, "pages"),
    "storage.tenant_quota_bytes": Range(0, int(LARGEST_NUMBER), "bytes, at most capacity_bytes"),
}
"""Dotted knob -> its range (a list knob: each of its values)."""


def value_of(cfg: DictConfig, key: str) -> Any:
    """The plain value at a dotted key of a composed config (None where it is absent, or a
    reference that does not resolve: its own problem is said elsewhere)."""
    try:
        value = OmegaConf.select(cfg, key, default=None)
        return (
            OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else value
        )
    except Exception:  # a ${reference} to no key, or a loop: `build` names it
        return None


def number(value: float) -> str:
    """A bound as a message shows it: whole numbers without a decimal point or exponent."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def out_of_range(value: Any, span: Range) -> bool:
    """Whether a number (or any number of a list) lies outside `span` (nan does)."""
    numbers = value if isinstance(value, list) else [value]
    return any(
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and not span.least <= v <= span.most  # nan too
        for v in numbers
    )


def range_problems(cfg: DictConfig, said: Collection[str] = ()) -> list[Problem]:
    """Each knob of a composed config outside its range, read as given (a group whose own
    checks failed still has each knob checked), but for the keys `said` names already."""
    found = []
    for key, span in RANGES.items():
        value = value_of(cfg, key)
        if key in said or value is None or not out_of_range(value, span):
            continue
        each = "each of its values " if isinstance(value, list) else ""
        bounds = f"[{number(span.least)}, {number(span.most)}]"
        message = f"{key}={shown(value)}: {each}must lie in {bounds} ({span.why})"
        found.append(Problem(key, message))
    return found


def port_problems(port: int | None, topology: Topology) -> list[Problem]:
    """Each rank serves metrics on port + its rank: the last rank's port must exist too."""
    if port is None or port + topology.tp_size - 1 <= PORT_MAX:
        return []
    key = "runtime.metrics_port"
    most = PORT_MAX - topology.tp_size + 1
    message = (
        f"{key}={port}: rank {topology.tp_size - 1} would serve on {port + topology.tp_size - 1}"
        f", beyond {PORT_MAX}: at most {most} at topology.tp_size={topology.tp_size}"
    )
    return [Problem(key, message)]


def ranges_table() -> str:
    """Every knob's range as a Markdown table (the reference the docs show)."""
    rows = [
        f"| `{key}` | {number(span.least)} | {number(span.most)} | {span.why} |"
        for key, span in RANGES.items()
    ]
    return "\n".join(["| knob | least | most | unit, why |", "| --- | --- | --- | --- |", *rows])
