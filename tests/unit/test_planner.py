"""The `plan` report's op counts for chunked backups (no process group, no byte moved)."""

from __future__ import annotations

import pytest
from conftest import job_config

from pipeline.planner import plan_report


@pytest.mark.parametrize(
    ("io", "layout", "gathered"),
    [
        ("kernel", "layer_first", True),
        ("direct", "page_first_direct", True),
        ("direct", "layer_first", False),  # the host keeps a page's layers apart
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
        else:  # per batch, one page of every layer per copy
            assert ops["batch_gather"] == 0
            assert ops["copy"] == 3 + 3 + 2
