"""An engine's asynchronous step loop over the public API: transfers are submitted, each
rank checks its own copies without a collective (`query()`), and every rank polls exactly
once per step (`poll()` is a collective), so the acks are released on every rank alike.

Two ranks:  torchrun --nproc-per-node 2 examples/async_loop.py
One rank:   python examples/async_loop.py topology=tp1

Arguments are config overrides. Each step backs up two pages; the step after a backup is
released, its pages are loaded into other device pages and checked bit-exact.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import pipeline

PAGES = 32  # device pages of the adopted KV: each step's source pages and, 16 on, its targets


def main(overrides: list[str]) -> None:
    if "WORLD_SIZE" in os.environ:  # started by torchrun: its rendezvous
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    base = ["model=tiny_mla", "topology=tp2", "topology.device=cpu", "workload.num_tokens=64"]
    job = pipeline.compose([*base, *overrides])
    size, row = job.model.page_size, job.model.kv_row_bytes // 2  # bf16 rows
    kv = [torch.zeros(PAGES, size, row, dtype=torch.bfloat16) for _ in range(job.model.num_layers)]
    engine = pipeline.create_engine(job, device_kv={("kv", i): t for i, t in enumerate(kv)})
    released = checked = 0
    try:
        for step in range(8):
            source = [2 * step % 16, 2 * step % 16 + 1]
            draw = torch.Generator().manual_seed(step)  # every rank holds the same KV
            for t in kv:
                t[source] = torch.randn(t[source].shape, generator=draw).to(t.dtype)
            expected = [t[source].clone() for t in kv]
            host = engine.host_slots.alloc(2 * size)
            # --- the loop as README.md shows it ---
            ack = engine.backup(host, page_slots(source, size))
            while not ack.query():  # rank-local: no collective, each rank at its own pace
                pass  # (an engine runs its forward here)
            released += len(engine.poll())  # a collective: once a step, on every rank
            # --- end ---
            target = [p + 16 for p in source]
            engine.load(host, page_slots(target, size)).done().wait()
            checked += all(torch.equal(t[target], e) for t, e in zip(kv, expected, strict=True))
            engine.poll()
            engine.host_slots.free(host)
    finally:
        engine.close()
        dist.destroy_process_group()
    print(f"released {released} backups, {checked} of 8 loads bit-exact")


def page_slots(pages: list[int], page_size: int) -> torch.Tensor:
    """The token slots of whole pages, in page order: what every index tensor holds."""
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])


if __name__ == "__main__":
    main(sys.argv[1:])
