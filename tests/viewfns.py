"""A scheduler beside the ranks: gloo ranks write prefixes back under keys of every kind
(SGLang's hex hashes and vLLM's ints through `pipeline.page_keys`, token ids through
`Engine.l3_keys`), and a process with no rank (`python tests/viewfns.py`, started by rank 0
while every rank still holds its engine: a Mooncake store's objects live in the ranks' memory)
looks them up through `pipeline.open_store`. Shared by tests/distributed/test_store_view.py;
spawned ranks import it by name (tests/ is on sys.path)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from gridfns import first_difference, layers, loaded

import pipeline
from pipeline.core.model import ModelKind

PAGES = 4
TOKENS = list(range(100, 100 + PAGES * 4))  # page_size 4 in every tiny model
SGLANG = [hashlib.sha256(f"page {i}".encode()).hexdigest() for i in range(PAGES)]
VLLM = [-(1 << 63), 3, (1 << 64) + 5, -42]
"""vLLM's block hashes are Python ints of any size and sign."""
DAMAGED = [f"{i:064x}" for i in range(PAGES)]
"""Written, then page 2's object removed by the last rank only (its share, where it has one)."""
COLD = ["ee" * 32, "ff" * 32]
"""Never written."""


def queries(job: pipeline.Job, tokens: list[str]) -> dict[str, list[str]]:
    """What the ranks and the scheduler both look up (`tokens`: the token ids' keys)."""
    sglang, vllm = pipeline.page_keys(job, SGLANG), pipeline.page_keys(job, VLLM)
    return {
        "sglang": sglang,
        "vllm": vllm,
        "tokens": tokens,
        "damaged": pipeline.page_keys(job, DAMAGED),
        "half": sglang[:2] + pipeline.page_keys(job, COLD),
        "cold": pipeline.page_keys(job, COLD) + sglang,
    }


def write_and_look(
    args: tuple[pipeline.Job, list[pipeline.Job], Path], rank: int, world: int, local: int
) -> dict:
    """Write every prefix back, look each up on the ranks and from a scheduler process,
    then load the SGLang- and vLLM-keyed prefixes back bit-exact."""
    job, others, folder = args
    engine = pipeline.create_engine(job)
    try:
        kv = layers(engine, job, None)
        # MLA ranks hold the same latent KV; MHA ranks hold their own heads
        own = rank if job.model.kind is ModelKind.mha else 0
        generator = torch.Generator().manual_seed(PAGES + own)
        for layer in kv:
            shape = layer[:PAGES].shape
            layer[:PAGES].copy_(
                torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
            )
        before = [layer[:PAGES].clone() for layer in kv]
        host = engine.host_slots.alloc(PAGES * 4)
        engine.backup(host, torch.arange(PAGES * 4)).wait()
        asked = queries(job, engine.l3_keys(TOKENS))
        for name in ("sglang", "vllm", "tokens", "damaged"):
            engine.write_back(asked[name], host).wait()
        released = 0
        while released < 4:  # a poll releases what every rank finished: the writer stored
            released += sum(ack.kind == "write_back" for ack in engine.poll())
        if rank == world - 1:
            engine.l3.store.remove([engine.l3.name(asked["damaged"][2])])
        dist.barrier()
        found = {name: engine.lookup(keys) for name, keys in asked.items()}
        scheduler = ask_scheduler(folder, job, others, asked) if rank == 0 else None
        dist.barrier()  # every rank holds its engine (and store) until the scheduler is done
        exact = {
            name: load_back(engine, kv, before, host, asked[name])
            for name in ("sglang", "vllm", "tokens")
        }
        return {"found": found, "scheduler": scheduler, "exact": exact}
    finally:
        engine.close()


def load_back(
    engine: pipeline.Engine,
    kv: list[torch.Tensor],
    before: list[torch.Tensor],
    host: torch.Tensor,
    keys: list[str],
) -> str:
    """'' if `keys`' pages load from L3 into zeroed device pages 8.. bit-exact, else why."""
    engine.host_slots.reuse(host)  # the host copy is gone: only L3 holds the pages
    for layer in kv:
        layer.zero_()
    target = torch.arange(8 * 4, (8 + PAGES) * 4)
    from_l3 = engine.load_from_l3(keys, host, target)
    if from_l3.hits != PAGES or from_l3.handle is None:
        return f"load_from_l3 found {from_l3.hits} of {PAGES} pages"
    loaded(engine, from_l3.handle)
    return first_difference([layer[8 : 8 + PAGES] for layer in kv], before, "load_from_l3")


def ask_scheduler(
    folder: Path, job: pipeline.Job, others: list[pipeline.Job], asked: dict[str, list[str]]
) -> dict:
    """What a plain process (no process group, no engine) answers: `python viewfns.py`."""
    path = folder / "scheduler.pkl"
    path.write_bytes(pickle.dumps((job, others, asked)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, __file__, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def scheduler(job: pipeline.Job, others: list[pipeline.Job], asked: dict[str, list[str]]) -> dict:
    """Each query's leading pages through the job's store view; whether each page of 'half'
    is there; whether the view keys token ids as the ranks do; and, for a job of another
    revision or tenant on the same store, the SGLang, vLLM and token-id prefixes found."""
    assert not dist.is_initialized()
    with pipeline.open_store(job) as view:
        said = {
            "found": {name: view.lookup(keys) for name, keys in asked.items()},
            "contains": [view.contains(key) for key in asked["half"]],
            "same_keys": view.keys(TOKENS) == asked["tokens"],
        }
    said["others"] = []
    for other in others:
        with pipeline.open_store(other) as view:
            keys = [pipeline.page_keys(other, SGLANG), pipeline.page_keys(other, VLLM)]
            said["others"].append([view.lookup(k) for k in [*keys, view.keys(TOKENS)]])
    return said


if __name__ == "__main__":
    print(json.dumps(scheduler(*pickle.loads(Path(sys.argv[1]).read_bytes()))))
