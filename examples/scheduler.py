"""A small scheduler loop over the public API: requests share prefixes; a prefix the host
tier holds is a hit (loaded back), any other is a miss (prefilled, then backed up).

One CPU rank:  python examples/scheduler.py
Two ranks:     torchrun --nproc-per-node 2 examples/scheduler.py topology=tp2 strategy=rotating

Arguments are config overrides. Every hit is checked bit-exact against the KV its prefix had
when it was prefilled; the loop prints hits, misses and evictions.
"""

from __future__ import annotations

import os
import random
import sys

import torch
import torch.distributed as dist

import pipeline


def main(overrides: list[str]) -> None:
    if "WORLD_SIZE" in os.environ:  # started by torchrun: its rendezvous
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    base = [
        "model=tiny_mla",
        "topology=tp1",
        "topology.device=cpu",
        "workload.host_ratio=0.04",
        "workload.num_tokens=32",
    ]
    job = pipeline.compose([*base, *overrides])
    engine = pipeline.create_engine(job)
    page = engine.sizing.slots_per_page
    rng = random.Random(0)  # the same on every rank: every rank schedules the same requests
    cached: dict[int, torch.Tensor] = {}  # prefix -> its host slots
    expected: dict[int, torch.Tensor] = {}  # prefix -> its KV of layer 0, when prefilled
    counts = {"hits": 0, "misses": 0, "evictions": 0}
    layer0 = engine.device_pool.layer(job.model.units[0])
    for _ in range(40):
        prefix, pages = rng.randrange(6), 2  # 6 prefixes of 2 pages each
        device = list(range(pages))  # the request's device pages (reused by every request)
        slots = torch.arange(pages * page)  # their token slots
        if prefix in cached:
            handle = engine.load(cached[prefix], slots)
            engine.begin_forward()
            handle.wait(0)  # the forward may start on layer 0 here
            handle.done().wait()
            assert torch.equal(layer0[device], expected[prefix]), f"prefix {prefix} differs"
            counts["hits"] += 1
        else:
            for unit in job.model.units:  # "prefill": this request's KV
                engine.device_pool.layer(unit)[device] = torch.randn(
                    engine.device_pool.layer(unit)[device].shape, generator=seeded(prefix)
                ).to(layer0.dtype)
            expected[prefix] = layer0[device].clone()
            if engine.host_slots.num_free < len(slots):  # evict the oldest prefix
                oldest = next(iter(cached))
                engine.host_slots.free(cached.pop(oldest))
                counts["evictions"] += 1
            host = engine.host_slots.alloc(len(slots))
            engine.backup(host, slots).wait()
            cached[prefix] = host
            counts["misses"] += 1
        engine.poll()
    engine.close()
    if dist.get_rank() == 0:
        print(f"{counts['hits']} hits, {counts['misses']} misses, {counts['evictions']} evictions")
    dist.destroy_process_group()


def seeded(prefix: int) -> torch.Generator:
    return torch.Generator().manual_seed(prefix)


if __name__ == "__main__":
    main(sys.argv[1:])
