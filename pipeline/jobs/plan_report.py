"""`plan`: per-rank bytes, op counts and host capacity of one cycle, without moving a byte.

Builds the same `TransferPlan`s the engine would (same plan spec, allocators and seeded
placement) for every rank of one pipeline stage, so it answers "what would tp 8 do" on a laptop.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import Any

from pipeline.config.assemble import stage_name
from pipeline.config.job import Job
from pipeline.config.schema import Placement
from pipeline.core.l3 import PageObject, page_roles, share_of
from pipeline.core.ownership import OwnerMap, Role, owner_map
from pipeline.core.plan import Direction, PlanSpec, TransferPlan, build_plan
from pipeline.core.sizing import device_staging_bytes, size_rank
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.core.steps import Step
from pipeline.core.topology import IoBackend, MemLayout
from pipeline.engine.strategy import Strategy


def stage_lists(strategy: Strategy) -> dict[str, dict[str, list[str]]]:
    """Stage names per direction (and the L3 tier's) and list."""
    return {
        direction: {
            f.name: [stage_name(s) for s in getattr(pipeline, f.name)]
            for f in dataclasses.fields(pipeline)
        }
        for direction, pipeline in (
            ("backup", strategy.backup),
            ("load", strategy.load),
            ("l3", strategy.l3),
        )
    }


def copy_calls(plan: TransferPlan, step: Step) -> int:
    """Copy calls `stages.copy` issues for a step on this rank. A gathered batch: one per
    run of pages (direct) or one scatter (kernel). A kernel step: one, or one per unit where
    the pools do not stack them, unless its pages are consecutive on both sides and each a
    block on the host (outside CUDA graphs): then DMAs as the direct backend's, per run one
    call for every stacked unit (a strided DMA or a batch of them), else one per unit."""
    if not plan.copies(step.unit):
        return 0
    spec, units = plan.spec, len(step.units)
    kernel = spec.io_backend is IoBackend.kernel
    stacked = units > 1 and spec.pools_stack
    if step.gathered:
        return 1 if kernel else len(plan.runs_in(step.first, step.count))
    as_dma = not plan.graphed and plan.consecutive and spec.mem_layout is not MemLayout.page_first
    if kernel and not as_dma:
        return 1 if stacked or units == 1 else units
    runs = len(plan.runs_in(step.first, step.count))
    return runs if stacked else units * runs


def counts(plan: TransferPlan) -> dict[str, int]:
    """Ops this rank issues for one transfer, by kind."""
    ops = {"copy": 0, "batch_gather": 0, "gather": 0, "broadcast": 0, "scatter": 0}
    for step in plan.steps:
        ops["batch_gather"] += plan.copies(step.unit) and step.gathered
        ops["copy"] += copy_calls(plan, step)
        role = plan.role(step.unit)
        if role is not Role.none:
            ops["broadcast"] += 1
            if plan.in_place(step) is None:  # else broadcast straight between device slots
                ops["gather" if role is Role.send else "scatter"] += 1
    return ops


def rank_row(job: Job, rank: int) -> dict[str, Any]:
    """One backup and one load-back of the workload on `rank`: bytes, ops, capacity."""
    model, topology, workload = job.model, job.topology, job.workload
    strategy = job.strategy.config
    sizing = size_rank(model, topology, strategy, rank, job.budget())
    owners = sizing.owners
    spec = PlanSpec.of(model, topology, strategy, sizing, rank)
    slots = sizing.slots_per_page
    num_pages = workload.num_tokens // slots
    pick = None if workload.placement is Placement.contiguous else random.Random(workload.seed)
    device_alloc = PageAllocator(sizing.device_pages)
    source = device_alloc.alloc(num_pages, pick)
    host = page_tokens(PageAllocator(sizing.host.num_pages).alloc(num_pages, pick), slots)
    target = device_alloc.alloc(num_pages, pick)
    row: dict[str, Any] = {"rank": rank}
    for direction, device_pages in ((Direction.backup, source), (Direction.load, target)):
        plan = build_plan(direction, host, page_tokens(device_pages, slots), spec)
        row.update({k: row.get(k, 0) + v for k, v in plan.bytes_moved().items()})
        row[f"{direction.value}_ops"] = counts(plan)
    row["load_broadcasts_per_layer"] = [  # `plan` is the load-back's now
        sum(1 for s in plan.layer_steps(layer) if plan.exchanged(s.unit))
        for layer in range(model.num_layers)
    ]
    if job.storage.attached:
        row.update(l3_row(job, rank, owners, num_pages))
    row["host_capacity_tokens"] = sizing.host_slots
    row["host_pool_bytes"] = sizing.host.pool_bytes
    row["device_staging_bytes"] = device_staging_bytes(strategy, topology, model, owners, rank)
    return row


def l3_row(job: Job, rank: int, owners: OwnerMap, num_pages: int) -> dict[str, int]:
    """A write-back and a load from L3 of the workload on `rank`, every page a hit."""
    model, topology = job.model, job.topology
    obj = PageObject(share_of(topology, model, rank), model.units)
    roles = page_roles(owners, model.units, rank)
    sent = num_pages * sum(u.page_bytes for u in owners.owned(rank, model.units))
    return {
        "l3_write_bytes": num_pages * obj.page_bytes if rank == roles.writer else 0,
        "l3_send_bytes": sent if rank in roles.senders else 0,
        "l3_read_bytes": num_pages * sum(u.page_bytes for u in roles.reads),
        "l3_hit_pages": num_pages,
    }


def plan_report(job: Job, ranks: list[int] | None = None) -> dict[str, Any]:
    """Per-rank numbers for one backup and one load-back of the workload."""
    model, topology = job.model, job.topology
    return {
        "model": model.name,
        "bytes_per_token": model.bytes_per_token,
        "topology": topology.name,
        "topology_label": topology.label,
        "attn_tp_size": topology.attn_tp_size,
        "num_tokens": job.workload.num_tokens,
        "placement": job.workload.placement.value,
        "stages": stage_lists(job.strategy),
        "group_size": len(topology.replica_group(0, model)),
        "ranks": rank_rows(job, range(topology.tp_size) if ranks is None else ranks),
    }


def rank_rows(job: Job, ranks: Iterable[int]) -> list[dict[str, Any]]:
    """`rank_row` of each rank, worked out once per role: ranks that copy units of the same
    sizes in the same order, hold the same place in replica groups of the same size, and
    own the same exchanged units' sizes get the same numbers (1024 rotating ranks of 4096
    layers took 75 s, one row each)."""
    model, strategy = job.model, job.strategy.config
    owner_maps: dict[tuple[int, ...], OwnerMap] = {}
    rows: dict[tuple, dict[str, Any]] = {}
    found = []
    for rank in ranks:
        group = job.topology.replica_group(rank, model)
        if group not in owner_maps:
            owner_maps[group] = owner_map(strategy.ownership, group, model.units)
        owners = owner_maps[group]
        copied = owners.owned(rank, model.units)
        role = (
            len(group),
            group.index(rank) == 0,  # the group's first: its source or L3 writer
            tuple((u.pool, u.page_bytes) for u in copied),
            tuple((u.pool, u.page_bytes) for u in copied if owners.exchanged(u.ordinal)),
        )
        if role not in rows:
            rows[role] = rank_row(job, rank)
        found.append({**rows[role], "rank": rank})
    return found


def broadcasts_per_layer(job: Job) -> tuple[list[int], int]:
    """(broadcasts of one load-back per model layer, replica group size) for rank 0."""
    report = plan_report(job, ranks=[0])
    return report["ranks"][0]["load_broadcasts_per_layer"], report["group_size"]
