"""`plan`: per-rank bytes, op counts and host capacity of one cycle, without moving a byte.

Builds the same `TransferPlan`s the engine would (same allocators, same seeded placement) for
every rank of one pipeline stage, so it answers "what would tp 8 do" on a laptop.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.assemble import PIPELINE_LISTS, assemble
from pipeline.config import typed
from pipeline.engine import (
    batch_staging_bytes,
    device_staging_bytes,
    plan_transfer,
    size_pools,
)
from pipeline.ownership import owner_map
from pipeline.plan import Direction, TransferPlan
from pipeline.pools import PageAllocator, page_tokens
from pipeline.schema import Placement, WorkloadConfig
from pipeline.topology import MemLayout, ModelGeometry, Topology


def stage_lists(strategy: DictConfig) -> dict[str, dict[str, list[str]]]:
    """Stage names with their arguments, per direction and list, as the config gives them."""

    def describe(node: Any) -> str:
        entry = OmegaConf.to_container(node, resolve=True)
        assert isinstance(entry, dict)
        name = str(entry.pop("_target_")).rsplit(".", 2)[-2]
        args = ", ".join(f"{k!s}={v}" for k, v in entry.items())
        return f"{name}({args})" if args else name

    return {
        d: {lst: [describe(n) for n in strategy[d][lst]] for lst in PIPELINE_LISTS}
        for d in ("backup", "load")
    }


def counts(plan: TransferPlan, batch_buffer_bytes: int, layout: MemLayout) -> dict[str, int]:
    """Ops this rank issues for one transfer, by kind (`batch_buffer_bytes`: each of a
    chunked backup's two batch buffers, 0 without them)."""
    ops = {"copy": 0, "batch_gather": 0, "gather": 0, "broadcast": 0, "scatter": 0}
    for step in plan.steps:
        gathered = plan.copies(step.unit) and plan.gathers_batch(step, batch_buffer_bytes, layout)
        ops["batch_gather"] += gathered
        ops["copy"] += plan.copy_ops(step, gathered)
        if plan.exchanged(step.unit):
            ops["broadcast"] += 1
            if plan.device_run(step) is None:  # consecutive pages are broadcast in place
                ops["gather" if plan.source(step.unit) == plan.rank else "scatter"] += 1
    return ops


def plan_report(plain: dict, ranks: list[int] | None = None) -> dict[str, Any]:
    """Per-rank numbers for one backup and one load-back of the workload."""
    cfg = typed(plain)
    model: ModelGeometry = OmegaConf.to_object(cfg.model)  # type: ignore[assignment]
    topology: Topology = OmegaConf.to_object(cfg.topology)  # type: ignore[assignment]
    workload: WorkloadConfig = OmegaConf.to_object(cfg.workload)  # type: ignore[assignment]
    strategy = assemble(cfg.strategy)
    rows = []
    for rank in range(topology.tp_size) if ranks is None else ranks:
        owners = owner_map(strategy.ownership, topology.replica_group(rank, model), model.units)
        sizing = size_pools(
            model,
            topology,
            owners,
            rank,
            device_tokens=workload.device_tokens,
            host_ratio=workload.host_ratio,
            keep_capacity=strategy.keep_capacity,
        )
        num_pages = workload.num_tokens // sizing.widened
        rng = random.Random(workload.seed)
        pick = None if workload.placement is Placement.contiguous else rng
        device_alloc = PageAllocator(sizing.device_pages)
        source = device_alloc.alloc(num_pages, pick)
        host = PageAllocator(sizing.host.num_pages).alloc(num_pages, pick)
        target = device_alloc.alloc(num_pages, pick)
        row: dict[str, Any] = {"rank": rank}
        for direction, device_pages in ((Direction.backup, source), (Direction.load, target)):
            plan = plan_transfer(
                direction,
                page_tokens(host, sizing.widened),
                page_tokens(device_pages, sizing.widened),
                rank=rank,
                model=model,
                topology=topology,
                owners=owners,
                sizing=sizing,
                staging_bytes=strategy.staging_bytes,
            )
            if direction is Direction.backup:
                plan = dataclasses.replace(
                    plan, steps=plan.chunked(strategy.chunk_pages, strategy.staging_bytes)
                )
            moved = plan.bytes_moved()
            row.update({k: row.get(k, 0) + v for k, v in moved.items()})
            buffer = batch_staging_bytes(strategy, model, owners, rank)
            row[f"{direction.value}_ops"] = counts(plan, buffer, topology.mem_layout)
        row["load_broadcasts_per_layer"] = [  # `plan` is the load-back's now
            sum(1 for s in plan.steps if s.unit.layer == layer and plan.exchanged(s.unit))
            for layer in range(model.num_layers)
        ]
        row["host_capacity_tokens"] = sizing.host_slots
        row["host_pool_bytes"] = sizing.host.pool_bytes
        row["device_staging_bytes"] = device_staging_bytes(strategy, model, owners, rank)
        rows.append(row)
    return {
        "model": model.name,
        "bytes_per_token": model.bytes_per_token,
        "topology": topology.name,
        "attn_tp_size": topology.attn_tp_size,
        "num_tokens": workload.num_tokens,
        "placement": workload.placement.value,
        "stages": stage_lists(cfg.strategy),
        "group_size": len(topology.replica_group(0, model)),
        "ranks": rows,
    }


def broadcasts_per_layer(plain: dict) -> tuple[list[int], int]:
    """(broadcasts of one load-back per model layer, replica group size) for rank 0."""
    report = plan_report(plain, ranks=[0])
    return report["ranks"][0]["load_broadcasts_per_layer"], report["group_size"]
