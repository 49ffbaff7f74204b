"""The public API as engines combine it, at tp1: every model kind x chunk_pages x adopted KV x
store, through backup, load, write-back and load_from_l3, all bit-exact.

The full product here is 3 x 4 x 3 x 2 = 72 engines, a few seconds on CPU, so no covering
design is needed; strategies and tp2 are `tests/distributed/test_dedup.py`'s grid (every
strategy x chunk_pages x adopted KV x host layout on 2 gloo ranks).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pipeline

Adopted = dict[object, torch.Tensor] | None


def adopted_kv(job: pipeline.Job, how: str) -> Adopted:
    """None (the engine allocates), one tensor per (pool kind, layer), or one stacked tensor
    per pool kind: shaped as the engine would allocate them."""
    if how == "none":
        return None
    engine = pipeline.create_engine(job)
    try:
        shapes = {(u.pool, u.layer): engine.device_pool.layer(u) for u in job.model.units}
    finally:
        engine.close()
    per_layer = {key: torch.zeros_like(t) for key, t in shapes.items()}
    if how == "per_layer":
        return per_layer
    kinds = sorted({pool for pool, _ in per_layer})
    return {
        kind: torch.stack([t for (pool, _), t in sorted(per_layer.items()) if pool == kind])
        for kind in kinds
    }


def device_layers(engine: pipeline.Engine, job: pipeline.Job) -> list[torch.Tensor]:
    return [engine.device_pool.layer(u) for u in job.model.units]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("store", ["none", "file"])
@pytest.mark.parametrize("adopted", ["none", "per_layer", "stacked"])
@pytest.mark.parametrize("chunk_pages", [0, 1, 2, 3])
@pytest.mark.parametrize("model", ["tiny_mla", "tiny_dsa", "tiny_mha"])
def test_every_combination_moves_its_pages_bit_exact(
    model: str, chunk_pages: int, adopted: str, store: str, tmp_path: Path
) -> None:
    overrides = [f"model={model}", "topology=tp1", "topology.device=cpu"]
    overrides.append(f"strategy.chunk_pages={chunk_pages}")
    if store == "file":
        overrides += ["storage=file", f"storage.path={tmp_path}"]
    job = pipeline.compose(overrides)
    engine = pipeline.create_engine(job, device_kv=adopted_kv(job, adopted))
    try:
        page, pages = job.model.page_size, 7  # 7 pages: a partial last batch
        source, target = torch.arange(0, pages * page), torch.arange(8 * page, (8 + pages) * page)
        generator = torch.Generator().manual_seed(pages)
        for layer in device_layers(engine, job):
            layer[:pages].copy_(torch.randint(0, 255, layer[:pages].shape, generator=generator))
        before = [layer[:pages].clone() for layer in device_layers(engine, job)]
        host = engine.host_slots.alloc(pages * page)
        engine.backup(host, source).wait()
        engine.load(host, target).done().wait()
        for i, layer in enumerate(device_layers(engine, job)):
            assert torch.equal(layer[8 : 8 + pages], before[i]), f"unit {i}: load"
        if store == "file":
            keys = engine.l3_keys(list(range(pages * page)))
            engine.write_back(keys, host).wait()
            engine.poll()
            engine.host_slots.reuse(host)  # evicted from the host: L3 holds the pages
            for layer in device_layers(engine, job):
                layer.zero_()
            loaded = engine.load_from_l3(keys, host, target)
            assert loaded.hits == pages and loaded.handle is not None
            loaded.handle.done().wait()
            for i, layer in enumerate(device_layers(engine, job)):
                assert torch.equal(layer[8 : 8 + pages], before[i]), f"unit {i}: from L3"
        engine.poll()
    finally:
        engine.close()
