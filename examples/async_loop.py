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
from pipeline.core.slots import page_tokens
from pipeline.jobs.contents import fill_random, first_mismatch, snapshot


def main(overrides: list[str]) -> None:
    if "WORLD_SIZE" in os.environ:  # started by torchrun: its rendezvous
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    base = ["model=tiny_mla", "topology=tp2", "topology.device=cpu", "workload.num_tokens=64"]
    engine = pipeline.create_engine(pipeline.compose([*base, *overrides]))
    size = engine.sizing.slots_per_page
    released = checked = 0
    try:
        for step in range(8):
            source = [2 * step % 16, 2 * step % 16 + 1]
            fill_random(engine, source, seed=step)
            expected = snapshot(engine, source)
            host = engine.host_slots.alloc(2 * size)
            # --- the loop as README.md shows it ---
            ack = engine.backup(host, page_tokens(source, size))
            while not ack.query():  # rank-local: no collective, each rank at its own pace
                pass  # (an engine runs its forward here)
            released += len(engine.poll())  # a collective: once a step, on every rank
            # --- end ---
            target = [p + 16 for p in source]
            engine.load(host, page_tokens(target, size)).done().wait()
            checked += first_mismatch(engine, target, expected) == ""
            engine.poll()
            engine.host_slots.free(host)
    finally:
        engine.close()
        dist.destroy_process_group()
    print(f"released {released} backups, {checked} of 8 loads bit-exact")


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1:])
