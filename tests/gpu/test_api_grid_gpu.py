"""The API grid on cuda (`gridfns.run_case` with topology.device=cuda: the caller's KV adopted
on the GPU, pinned host pools, CUDA streams and events): on one GPU the whole tp1 product
(model x chunk_pages x adopted KV x store, 72 engines, as tests/unit/test_api_grid.py on
CPU), and on two GPUs over NCCL the whole tp2 product (every strategy, 168 engines: on GPUs
there is time for what the CPU grid covers with a design of strength 3). Each test is one
process per GPU serving all its cases; it skips without CUDA, or with one GPU for tp2.
Run on the device machine with `python -m pytest tests/gpu/test_api_grid_gpu.py`.
"""

from __future__ import annotations

from pathlib import Path

import gridfns
import pytest
import torch

from pipeline.jobs.launch import launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


def grid_on_gpus(cases: list[gridfns.Case], ranks: int, store_root: Path) -> None:
    """Every case bit-exact on every rank, and non-contiguous views refused on each."""
    grid = gridfns.Grid.of(cases, store_root)
    reports = launch(gridfns.run_cases, grid, ranks, backend="nccl", timeout_s=120, job_s=300)
    assert reports is not None
    said = {str(case): s for case, *s in zip(cases, *(r["cases"] for r in reports), strict=True)}
    assert {case: s for case, s in said.items() if any(s)} == {}
    for message in (m for r in reports for m in r["refused"]):
        assert message.startswith("device_kv[('kv', 0)]: not contiguous (strides "), message


def test_the_tp1_grid_is_bit_exact_on_one_gpu(tmp_path: Path) -> None:
    grid_on_gpus(gridfns.whole_product(tp=1, device="cuda"), 1, tmp_path)


@TWO_GPUS
def test_the_tp2_grid_is_bit_exact_on_both_gpus(tmp_path: Path) -> None:
    grid_on_gpus(gridfns.whole_product(tp=2, device="cuda"), 2, tmp_path)
