"""The cuda path (NCCL, CUDA streams and events, pinned pools, UVA gathers, CUDA graphs).

Every test runs on two GPUs (tp2: the dedup strategies, the exchange), and those that need no
peer also on one (tp1, replicated). Each skips where fewer GPUs are present; run on the device
machine with `python -m pytest tests/gpu`.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import rankfns
import torch
from conftest import MOONCAKE, job_config

from pipeline.config.job import Job
from pipeline.engine.cuda.cudart import Cudart, cuda_runtime
from pipeline.engine.cuda.streams import CudaStream
from pipeline.engine.transfer.pools import host_buffer, uva_alias
from pipeline.jobs.l3_store import concrete
from pipeline.jobs.launch import launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

IO_LAYOUTS = (
    ("direct", "layer_first"),
    ("direct", "page_first_direct"),
    ("kernel", "layer_first"),
    ("kernel", "page_first"),
)
CUDA = ("topology.device=cuda", "topology=tp2")
ONE_GPU = ("topology.device=cuda", "topology=tp1", "strategy=replicated")
ON_GPUS = [
    pytest.param(2, "rotating", marks=TWO_GPUS, id="tp2-rotating"),
    pytest.param(1, "replicated", id="tp1-replicated"),
]
"""(ranks, strategy) pairs a test runs as: two GPUs exchange, one GPU copies alone."""


def on_gpus(ranks: int, strategy: str) -> tuple[str, ...]:
    return ("topology.device=cuda", f"topology=tp{ranks}", f"strategy={strategy}")


def test_bit_exact_on_one_gpu_for_every_io_backend_and_placement() -> None:
    configs = [
        job_config(
            *ONE_GPU,
            f"model={m}",
            f"topology.io_backend={io}",
            f"topology.mem_layout={layout}",
            f"workload.placement={p}",
            "workload.num_tokens=2048",
            "workload.device_tokens=8192",
            f"strategy.chunk_pages={chunk}",
        )
        for m, (io, layout), p, chunk in itertools.product(
            ("deepseek_v3", "deepseek_v32"), IO_LAYOUTS, ("contiguous", "fragmented"), (0, 8)
        )
    ]
    ranks = launch(rankfns.run_jobs, configs, 1, backend="nccl", timeout_s=300)
    assert ranks is not None
    for i, cfg in enumerate(configs):
        assert ranks[0][i]["verified"], (cfg.topology, ranks[0][i]["mismatch"])


@TWO_GPUS
def test_bit_exact_on_both_gpus_for_every_strategy_and_io_backend() -> None:
    configs = [
        job_config(
            *CUDA,
            f"strategy={s}",
            f"model={m}",
            f"topology.io_backend={io}",
            f"topology.mem_layout={layout}",
            f"workload.placement={p}",
            f"strategy.ordering={o}",
            "workload.num_tokens=2048",
            "workload.device_tokens=8192",
            "strategy.chunk_pages=8",
        )
        for s, m, (io, layout), p, o in itertools.product(
            ("replicated", "single_source", "rotating"),
            ("deepseek_v3", "deepseek_v32"),
            IO_LAYOUTS,
            ("contiguous", "fragmented"),
            ("gate", "forward_stream"),
        )
    ]
    ranks = launch(rankfns.run_jobs, configs, 2, backend="nccl", timeout_s=300)
    assert ranks is not None
    for i, cfg in enumerate(configs):
        for r in ranks:
            assert r[i]["verified"], (cfg.strategy.config.name, cfg.topology, r[i]["mismatch"])


@pytest.mark.parametrize(("ranks", "strategy"), ON_GPUS)
@pytest.mark.parametrize("chunk_pages", [0, 3])  # 3: 8 pages through both batch buffers
@pytest.mark.parametrize("io", ["direct", "kernel"])
def test_issue_path_never_syncs_the_device(
    io: str, chunk_pages: int, ranks: int, strategy: str
) -> None:
    layout = "page_first_direct" if io == "direct" else "page_first"
    cfg = job_config(
        *on_gpus(ranks, strategy),
        "model=deepseek_v32",
        f"topology.io_backend={io}",
        f"topology.mem_layout={layout}",
        "workload.device_tokens=4096",
        f"strategy.chunk_pages={chunk_pages}",
    )
    said = launch(rankfns.no_sync_on_issue, cfg, ranks, backend="nccl", timeout_s=300)
    assert said == [""] * ranks


@pytest.mark.parametrize("group_bytes", [0, 2 << 20])  # each layer alone; 8 layers a group
@pytest.mark.parametrize(("ranks", "strategy"), ON_GPUS)
def test_forward_uses_layer_0_while_the_last_layer_is_in_flight(
    ranks: int, strategy: str, group_bytes: int
) -> None:
    """4 pages of deepseek_v3 (295 KB a layer): layer 0 is usable while the last layer (or
    group of layers, strategy.load_group_bytes) is held up on the load stream."""
    cfg = job_config(
        *on_gpus(ranks, strategy),
        "model=deepseek_v3",
        "workload.device_tokens=4096",
        f"strategy.load_group_bytes={group_bytes}",
    )
    results = launch(rankfns.overlap_cuda, cfg, ranks, backend="nccl", timeout_s=300)
    assert results is not None
    for r in results:
        assert r == {"layer0_ready": True, "last_ready_early": False, "mismatch": ""}


def graph_config(ranks: int, strategy: str, *overrides: str) -> Job:
    return job_config(
        *on_gpus(ranks, strategy),
        "model=deepseek_v32",
        "topology.io_backend=kernel",
        "topology.mem_layout=layer_first",
        "workload.device_tokens=4096",
        "strategy.chunk_pages=4",
        *overrides,
    )


@pytest.mark.parametrize(
    ("ranks", "strategy"),
    [*ON_GPUS, pytest.param(2, "replicated", marks=TWO_GPUS, id="tp2-replicated")],
)
def test_same_sized_transfers_replay_one_graph_per_direction(ranks: int, strategy: str) -> None:
    args = (graph_config(ranks, strategy), [6, 6, 6])
    results = launch(rankfns.graph_replays, args, ranks, backend="nccl", timeout_s=300)
    assert results is not None
    for r in results:
        assert r["mismatches"] == ["", "", ""]
        assert r["captures"] == 2 and r["same_ops"] and r["ops"] > 0


@pytest.mark.parametrize(("ranks", "strategy"), ON_GPUS)
def test_evicted_graphs_are_captured_again(ranks: int, strategy: str) -> None:
    args = (graph_config(ranks, strategy, "strategy.cuda_graph_cache=1"), [6, 5, 6])
    results = launch(rankfns.graph_replays, args, ranks, backend="nccl", timeout_s=300)
    assert results is not None
    for r in results:
        assert r["mismatches"] == ["", "", ""]
        assert r["captures"] == 6 and r["kept"] == 1  # each transfer evicts the one before


def test_a_registered_pool_is_reachable_by_uva_kernels_and_by_one_dma_over_it_all() -> None:
    """A pool above the pinning limit is registered, in one piece: a DMA over all of it (it
    would span two pieces, which fails, if it were registered piece by piece)."""
    host = host_buffer((40, 64, 576), torch.uint8, pin_memory=True, limit_bytes=1 << 20)
    assert host.is_pinned()  # 1.4 MiB > 1 MiB: registered, not pinned by torch
    host.copy_(torch.randint(0, 256, host.shape, dtype=torch.uint8))
    pages = torch.tensor([39, 0, 17, 18, 5])
    got = uva_alias(host, torch.device("cuda", 0)).index_select(0, pages.cuda()).cpu()
    assert torch.equal(got, host.index_select(0, pages))
    device = torch.empty(host.shape, dtype=host.dtype, device="cuda")
    device.copy_(host, non_blocking=True)  # one cudaMemcpyAsync from the registered pool
    back = torch.empty_like(host).pin_memory()
    back.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, host)


@pytest.mark.parametrize(
    "ranks", [pytest.param(2, marks=TWO_GPUS, id="tp2"), pytest.param(1, id="tp1")]
)
def test_a_failed_transfer_leaves_the_next_one_working(ranks: int) -> None:
    """On cuda a stage error surfaces at issue, from the call itself; the transfer touched no
    collective, so the engine stays usable and the next round trip is bit-exact. (Graphs off:
    a failure inside a capture leaves the engine refusing calls, by design.)"""
    job = job_config(
        *on_gpus(ranks, "replicated"), "model=deepseek_v3", "strategy.cuda_graph_cache=0"
    )
    said = launch(rankfns.failed_then_next, (job, "backup"), ranks, backend="nccl", timeout_s=300)
    assert said is not None
    assert "injected fault on rank 0" in said[0]["first"]
    assert [s["second"] for s in said] == [""] * ranks


@pytest.mark.parametrize("kind", ["file", MOONCAKE])
@pytest.mark.parametrize("ranks", [pytest.param(2, marks=TWO_GPUS, id="tp2"), 1])
def test_loads_back_from_l3_bit_exact_into_gpu_pages(ranks: int, kind: str) -> None:
    """Backup, write-back to L3, evict from device and host, load back from L3 into pinned
    host pages of both layouts (a unit's page contiguous, or strided)."""
    strategies = ("replicated", "single_source", "rotating") if ranks > 1 else ("replicated",)
    configs = [
        job_config(
            *on_gpus(ranks, strategy),
            "model=deepseek_v32",
            f"storage={kind}",
            f"topology.mem_layout={layout}",
            "workload.num_tokens=1024",
            "workload.device_tokens=4096",
            f"workload.seed={i}",
        )
        for i, (strategy, layout) in enumerate(
            itertools.product(strategies, ("page_first", "layer_first"))
        )
    ]
    with concrete(configs[0].storage) as storage:
        jobs = [dataclasses.replace(job, storage=storage) for job in configs]
        found = launch(rankfns.run_jobs, jobs, ranks, backend="nccl", timeout_s=300)
    assert found is not None
    for i, job in enumerate(jobs):
        reports = [found[r][i] for r in range(ranks)]
        assert all(r["verified"] for r in reports), (job.topology, reports[0]["mismatch"])
        assert all(r["l3_hit_pages"] > 0 for r in reports)


def test_an_event_not_ready_leaves_no_error_for_the_next_kernel() -> None:
    """cudaEventQuery's "not ready" is kept as the runtime's last error unless cleared: the
    engine's events (`pipeline.engine.cuda.cudart`) clear it, or torch's next launch would raise."""
    api = Cudart(cuda_runtime(torch.device("cuda")))
    stream = CudaStream(torch.cuda.Stream(), 30.0, api)
    event = stream.new_event()
    with torch.cuda.stream(stream.stream):
        torch.cuda._sleep(200_000_000)  # about a tenth of a second of GPU cycles
    stream.record(event)
    assert not event.query()  # still sleeping
    torch.ones(4, device="cuda").sum().item()  # a launch and a sync: no error left to raise
    event.wait()
    assert event.query()
