"""Two serving instances, one L3 store: what one writes back, the other finds and loads
bit-exact, whatever its TP size and strategy (the stored form does not depend on the writer).

Each instance is its own launch with its own ranks. With a folder both can reach:

  torchrun --nproc-per-node 2 examples/shared_store.py write topology=tp2 \\
      strategy=rotating storage=file storage.path=/srv/l3
  python examples/shared_store.py read topology=tp1 storage=file storage.path=/srv/l3

or with a Mooncake master the user started (README, "Sharing a store"): storage=mooncake
storage.master=HOST:PORT storage.metadata_server=P2PHANDSHAKE. Mooncake keeps objects in the
memory its clients lend (storage.segment_bytes per rank), so there the writer stays up until
the reader is done: `write --hold-until FILE` waits for FILE to exist before it exits.
Arguments after the role (and --hold-until) are config overrides. The reader prints, per
prefix, the pages found, the pages loaded and whether every byte of them is what the writer
wrote (each prefix's KV is drawn from a seed).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import pipeline

PREFIXES, PAGES = 3, 2
"""Prefixes each instance handles, and pages of each."""
HOLD_S = 600
"""The longest a writer holds its share of a Mooncake store for a reader."""


def main(role: str, overrides: list[str]) -> None:
    if role not in ("write", "read"):
        raise SystemExit("usage: shared_store.py write [--hold-until FILE] | read [OVERRIDE ...]")
    hold = overrides[1] if overrides[:1] == ["--hold-until"] else None
    overrides = overrides[2:] if hold else overrides
    if "WORLD_SIZE" in os.environ:  # started by torchrun: its rendezvous
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    base = ["model=tiny_mla", "topology.device=cpu", "workload.num_tokens=32"]
    engine = pipeline.create_engine(pipeline.compose([*base, *overrides]))
    try:
        found = [write(engine, p) if role == "write" else read(engine, p) for p in range(PREFIXES)]
        while engine.num_pending_acks:  # every write-back and load acknowledged on every rank
            engine.poll()
        if dist.get_rank() == 0:
            print(json.dumps({"role": role, "prefixes": found}), flush=True)
        if hold is not None:
            hold_until(hold)
    finally:
        engine.close()
    dist.destroy_process_group()


def hold_until(path: str) -> None:
    """Keep this instance (and the memory it lends the store) up until `path` exists."""
    deadline = time.monotonic() + HOLD_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear in {HOLD_S} s")
        time.sleep(0.1)
    dist.barrier()


def tokens(engine: pipeline.Engine, prefix: int) -> list[int]:
    """The prefix's token ids: ids no other prefix uses."""
    first = prefix * 1_000_000
    return list(range(first, first + PAGES * engine.sizing.slots_per_page))


def kv_of(engine: pipeline.Engine, prefix: int) -> dict[int, torch.Tensor]:
    """The prefix's KV, per unit: what a prefill would have made, drawn from its seed."""
    drawn = {}
    for unit in engine.model.units:
        layer = engine.device_pool.layer(unit)
        seed = torch.Generator().manual_seed(1000 * prefix + unit.ordinal)
        drawn[unit.ordinal] = torch.randn(layer[:PAGES].shape, generator=seed).to(layer.dtype)
    return drawn


def write(engine: pipeline.Engine, prefix: int) -> dict:
    """Prefill the prefix into device pages 0.., back it up and write it back to L3."""
    slots = torch.arange(PAGES * engine.sizing.slots_per_page)
    for unit in engine.model.units:
        engine.device_pool.layer(unit)[:PAGES] = kv_of(engine, prefix)[unit.ordinal]
    host = engine.host_slots.alloc(len(slots))
    engine.backup(host, slots).wait()
    engine.write_back(engine.l3_keys(tokens(engine, prefix)), host).wait()
    return {"prefix": prefix, "written": PAGES}


def read(engine: pipeline.Engine, prefix: int) -> dict:
    """Look the prefix up, load what L3 holds into device pages PAGES.. and compare."""
    keys = engine.l3_keys(tokens(engine, prefix))
    found = engine.lookup(keys)
    size = engine.sizing.slots_per_page
    slots = torch.arange(PAGES * size, 2 * PAGES * size)
    loaded = engine.load_from_l3(keys, engine.host_slots.alloc(len(slots)), slots)
    if loaded.handle is not None:
        engine.begin_forward()
        loaded.handle.done().wait()
    expected = kv_of(engine, prefix)
    exact = all(
        torch.equal(engine.device_pool.layer(u)[PAGES : PAGES + loaded.hits], kv[: loaded.hits])
        for u, kv in zip(engine.model.units, expected.values(), strict=True)
    )
    return {"prefix": prefix, "found": found, "loaded": loaded.hits, "exact": exact}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:])
