"""What the run job puts in the pools and checks there: seeded random pages, poison in evicted
slots, and the first byte that differs from what was backed up.

Every rank of a replica group draws the same bytes (MLA: they hold the same latent KV), so a
dedup strategy must reproduce on each rank exactly what that rank backed up; poisoned slots
mean stale bytes can never pass the check.
"""

from __future__ import annotations

import random

import torch

from pipeline.config.schema import WorkloadConfig
from pipeline.engine.engine import Engine

POISON = 0xA5
"""Byte written into evicted and freshly allocated slots before a load-back."""


def fill_random(engine: Engine, pages: list[int], seed: int) -> None:
    """Random bytes into device pages, drawn on the pool's device from `seed` (seeded per
    replica group, so peers draw the same bytes)."""
    device = engine.runtime.device
    generator = torch.Generator(device=device).manual_seed(seed)
    index = torch.tensor(pages, dtype=torch.int64, device=device)
    for unit in engine.model.units:
        layer = engine.device_pool.layer(unit).view(torch.uint8)
        shape = (len(pages), *layer.shape[1:])
        data = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator, device=device)
        layer.index_copy_(0, index, data)


def poison(engine: Engine, pages: list[int]) -> None:
    index = torch.tensor(pages, dtype=torch.int64, device=engine.runtime.device)
    for unit in engine.model.units:
        engine.device_pool.layer(unit).view(torch.uint8).index_fill_(0, index, POISON)


def snapshot(engine: Engine, pages: list[int]) -> dict[int, torch.Tensor]:
    index = torch.tensor(pages, dtype=torch.int64, device=engine.runtime.device)
    return {
        u.ordinal: engine.device_pool.layer(u).view(torch.uint8).index_select(0, index)
        for u in engine.model.units
    }


def first_mismatch(engine: Engine, pages: list[int], expected: dict[int, torch.Tensor]) -> str:
    """'' when every unit's pages equal the expected bytes, else where they first differ."""
    got = snapshot(engine, pages)
    for unit in engine.model.units:
        bad = (got[unit.ordinal] != expected[unit.ordinal]).flatten(1).any(1).nonzero()
        if len(bad):
            page = int(bad[0])
            return (
                f"rank {engine.runtime.rank}: {unit.pool} layer {unit.layer} differs at "
                f"transfer page {page} (device page {pages[page]}); {len(bad)} pages differ"
            )
    return ""


def poison_host(engine: Engine, pages: list[int]) -> None:
    """Overwrite host pages of every unit this rank holds (the host tier forgets them)."""
    index = torch.tensor(pages, dtype=torch.int64)
    for unit in engine.host_pool.owned:
        engine.host_pool.layer(unit).view(torch.uint8).index_fill_(0, index, POISON)


def prompt(engine: Engine, workload: WorkloadConfig, cycle: int) -> list[int]:
    """The token ids of one round's prefix: drawn per round and attention group (its replica
    groups, DCP shards or MHA ranks, share one sequence)."""
    first = engine.topology.attn_group(engine.runtime.rank)[0]
    rng = random.Random(workload.seed * 1_000_003 + cycle * 7919 + first)
    return [rng.randrange(1 << 31) for _ in range(workload.num_tokens)]
