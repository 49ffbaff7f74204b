"""What vLLM's scheduler process tells every worker each step (pickled to each): the host
pages to free, the loads to issue before the forward, and the backups and write-backs of
the blocks the step fills."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from pipeline.integrations.vllm.directory import BlockHash


@dataclass(frozen=True)
class Moves:
    """Blocks and the host pages they go to or come from, with their block hashes."""

    blocks: list[int]
    """vLLM's block ids (device pages)."""
    pages: list[int]
    """Host pages, one a block."""
    hashes: list[BlockHash]
    """vLLM's block hashes: the page keys' (`pipeline.page_keys`)."""


@dataclass
class StepMeta(KVConnectorMetadata):
    """One step's work, in the order the workers carry it out."""

    frees: list[int] = field(default_factory=list)
    """Host pages evicted (or found bad): freed before anything else."""
    host_loads: list[Moves] = field(default_factory=list)
    """Host -> device, before the forward reads the layers."""
    store_loads: list[Moves] = field(default_factory=list)
    """Store -> host -> device (into claimed pages), before the forward reads the layers."""
    missing: list[int] = field(default_factory=list)
    """Blocks vLLM expects loaded that no page could take: reported as load errors."""
    backups: list[Moves] = field(default_factory=list)
    """Device -> host (into claimed pages) once the forward wrote them, then host -> store."""
