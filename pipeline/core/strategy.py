"""A strategy as configured: its ownership, eligibility, stage lists and knobs.

`StrategyConfig` is the typed schema of the `strategy` config group. Every knob lives here and
nowhere else (stage entries carry no copies), and every range check of a knob runs in
`__post_init__`, so `validate` reports it with its file and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pipeline.core.checks import at_least, raise_problems
from pipeline.core.ownership import Ownership


class Ordering(Enum):
    """How a load's broadcasts stay ordered against the forward's collectives."""

    gate = "gate"
    forward_stream = "forward_stream"


@dataclass(kw_only=True)
class PipelineConfig:
    """One direction's stage entries (`_target_` mappings), per list."""

    prepare: list[Any] = field(default_factory=list)
    """Stages run once per transfer before any step (upload_page_ids)."""
    per_step: list[Any] = field(default_factory=list)
    """Stages run for every step on the transfer stream (copy)."""
    exchange: list[Any] = field(default_factory=list)
    """Stages run for every step after per_step: on the transfer stream with ordering=gate, on
    the consumer's stream at wait(layer) with ordering=forward_stream."""
    finish: list[Any] = field(default_factory=list)
    """Stages run once after the last step (record_event, verify)."""


@dataclass(kw_only=True)
class L3PipelineConfig:
    """The L3 tier's stage entries (used only with a store: `storage.kind` file or mooncake)."""

    write_back: list[Any] = field(default_factory=list)
    """Stages that store backed-up host pages in L3, on the write-back thread."""
    fetch: list[Any] = field(default_factory=list)
    """Stages that read L3 objects into host pages (or device pages) before a load."""


@dataclass(kw_only=True)
class IdleSyncSkipConfig:
    """Leaving out the ack poll's collective while nothing is in flight."""

    enabled: bool = False
    """Skip the per-poll MIN all-reduce while no ack is outstanding (and no storage backend)."""
    max_skips: int = 8
    """After this many consecutive skips one sync is forced (and checks replicated state)."""


@dataclass(kw_only=True)
class StrategyConfig:
    """Who moves which layer, the stages that move it, and the strategy's knobs."""

    name: str
    """Strategy name, shown in reports and used as a fallback target."""
    ownership: Ownership
    """Which rank of the replica group moves each layer."""
    requires: list[str] = field(default_factory=list)
    """Eligibility rules that must all pass for this strategy to be active."""
    fallback: str | None = None
    """Strategy option used when a required rule fails; null means none (always active)."""
    backup: PipelineConfig = field(default_factory=PipelineConfig)
    """Stages of a backup (device -> host)."""
    load: PipelineConfig = field(default_factory=PipelineConfig)
    """Stages of a load-back (host -> device)."""
    l3: L3PipelineConfig = field(default_factory=L3PipelineConfig)
    """Stages of a write-back (host -> L3) and a fetch (L3 -> host, before a load-back)."""
    chunk_pages: int = 0
    """Plan each backup in batches of this many pages (every copied layer per batch); 0 plans
    one batch."""
    load_group_bytes: int = 64 * 1024 * 1024
    """A load copies consecutive layers that no rank broadcasts (every layer of replicated)
    together, one copy call or kernel per pool kind, until a group moves at least this many
    bytes: each of its layers is usable once the group is. At 61 layers a call per layer
    costs the host more than small layers take to move (issue time, BENCHMARKS.md); 0 moves
    each layer on its own (every layer usable as soon as it lands)."""
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
    cuda_graph_cache: int = 8
    """On cuda with io_backend=kernel, a gated transfer (every backup; loads with
    ordering=gate) replays a CUDA graph of its copies and exchanges, captured on the first
    transfer of its page count: how many such graphs are kept (0: no graphs, every transfer
    is issued stage by stage)."""

    def __post_init__(self) -> None:
        knobs = at_least(
            "strategy",
            self,
            chunk_pages=0,
            load_group_bytes=0,
            staging_bytes=1,
            verify_every=0,
            poll_timer_every=0,
            cuda_graph_cache=0,
        )
        skip = at_least("strategy.idle_sync_skip", self.idle_sync_skip, max_skips=1)
        raise_problems(knobs + skip)
