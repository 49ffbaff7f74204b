"""The `plan` report's op counts for chunked backups (no process group, no byte moved)."""

from __future__ import annotations

import pytest
from conftest import job_config

from pipeline.jobs.plan_report import plan_report, rank_row


@pytest.mark.parametrize(
    ("io", "layout", "gathered"),
    [
        ("kernel", "layer_first", False),  # one launch per batch, device pages to host
        ("kernel", "page_first", False),
        ("direct", "page_first_direct", True),
        ("direct", "layer_first", False),  # a layer's pages are contiguous on both sides
    ],
)
def test_a_chunked_backup_counts_one_gather_and_one_copy_per_batch(
    io: str, layout: str, gathered: bool
) -> None:
    report = plan_report(
        job_config(
            "topology=tp2",
            f"topology.io_backend={io}",
            f"topology.mem_layout={layout}",
            "workload.placement=contiguous",
            "workload.num_tokens=32",
            "workload.device_tokens=128",
            "strategy.chunk_pages=3",
        )
    )
    for rank in report["ranks"]:
        ops = rank["backup_ops"]
        batches = 3  # 8 pages in batches of 3, 3 and 2, one pool kind (tiny_mla)
        if gathered:
            assert ops["batch_gather"] == ops["copy"] == batches
        else:  # per batch one kernel, or one strided copy of every layer's run of pages
            assert ops["batch_gather"] == 0
            assert ops["copy"] == batches


def test_plan_reports_the_device_memory_of_the_staging_buffers() -> None:
    """rotating at TP2: the 128 MiB exchange buffer, plus with chunk_pages=16 and direct
    copies to a page_first_direct host two batch buffers of 16 pages of the layers the rank
    copies (31 or 30 of deepseek_v3's 61); the kernel backend gathers no batch, so none."""
    common = ("strategy=rotating", "topology=tp2", "model=deepseek_v3")
    direct = ("topology.io_backend=direct", "topology.mem_layout=page_first_direct")
    kernel = ("topology.mem_layout=page_first",)
    page = 64 * 1152  # a layer's page: 64 tokens of 576 bf16
    cases = [
        (kernel, 0, (0, 0)),
        (kernel, 16, (0, 0)),
        (direct, 0, (0, 0)),
        (direct, 16, (16 * 31 * page, 16 * 30 * page)),
    ]
    for io, chunk, batches in cases:
        report = plan_report(job_config(*common, *io, f"strategy.chunk_pages={chunk}"))
        got = [r["device_staging_bytes"] for r in report["ranks"]]
        assert got == [128 * 2**20 + 2 * b for b in batches], (io, chunk)


@pytest.mark.parametrize("strategy", ["replicated", "single_source", "rotating"])
@pytest.mark.parametrize(
    "setting",
    [
        ("topology=tp8", "model=tiny_dsa"),
        ("topology=tp4_dp2", "model=tiny_mla", "storage=file"),
        ("topology=h200x8_dp8", "model=tiny_dsa", "strategy.chunk_pages=2"),
        ("topology=tp8_dcp4", "model=tiny_mla", "workload.placement=fragmented"),
        ("topology=tp8", "model=tiny_mha", "storage=file"),
        ("topology=tp8", "model=glm5", "storage=file", "strategy.chunk_pages=3"),
    ],
)
def test_ranks_of_one_role_get_the_numbers_of_their_own_plans(
    strategy: str, setting: tuple[str, ...]
) -> None:
    """`plan` works a row out once per role (1024 rotating ranks took 75 s one row each): for
    every rank the shared row equals that rank's own."""
    job = job_config(f"strategy={strategy}", *setting)
    shared = plan_report(job)["ranks"]
    own = [rank_row(job, r) for r in range(job.topology.tp_size)]
    assert shared == own
