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
        "workload.host_bytes=12800",  # 10 pages of 5 layers' 4 rows of 64 B: evictions soon
        "workload.num_tokens=32",
    ]
    job = pipeline.compose([*base, *overrides])
    page, row = job.model.page_size, job.model.kv_row_bytes // 2  # bf16 rows
    kv = [torch.zeros(8, page, row, dtype=torch.bfloat16) for _ in range(job.model.num_layers)]
    engine = pipeline.create_engine(job, device_kv={("kv", i): t for i, t in enumerate(kv)})
    rng = random.Random(0)  # the same on every rank: every rank schedules the same requests
    cached: dict[int, torch.Tensor] = {}  # prefix -> its host slots
    expected: dict[int, torch.Tensor] = {}  # prefix -> its KV of layer 0, when prefilled
    counts = {"hits": 0, "misses": 0, "evictions": 0}
    for _ in range(40):
        prefix, device = rng.randrange(6), [0, 1]  # 6 prefixes of 2 pages; device pages reused
        slots = torch.arange(len(device) * page)  # their token slots
        if prefix in cached:
            handle = engine.load(cached[prefix], slots)
            engine.begin_forward()
            handle.wait(0)  # the forward may start on layer 0 here
            handle.done().wait()
            assert torch.equal(kv[0][device], expected[prefix]), f"prefix {prefix} differs"
            counts["hits"] += 1
        else:
            draw = torch.Generator().manual_seed(prefix)
            for t in kv:  # "prefill": this request's KV
                t[device] = torch.randn(t[device].shape, generator=draw).to(t.dtype)
            expected[prefix] = kv[0][device].clone()
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


if __name__ == "__main__":
    main(sys.argv[1:])
