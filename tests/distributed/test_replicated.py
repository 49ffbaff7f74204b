"""The replicated path on real gloo ranks: bit-exact over the whole matrix, chunking invisible."""

from __future__ import annotations

import itertools

import pytest
import rankfns
from conftest import all_pairs, job_config

from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
DTYPES = ("bf16", "fp16", "fp8")
PLACEMENTS = ("contiguous", "fragmented")
SMALL = ("workload.num_tokens=32", "workload.device_tokens=128", "workload.cycles=1")


FULL_GRID_TP = (1, 2)
"""Where every combination runs; at tp 4 (the same per-rank work on more ranks) every pair of
settings of any two factors does, which keeps the suite inside CI's time on 2 cores."""


def matrix(tp: int) -> list[dict]:
    jobs = []
    grid = list(itertools.product(LAYOUTS, DTYPES, PLACEMENTS, (0, 3), ("direct", "kernel")))
    for layout, dtype, placement, chunk, io in grid if tp in FULL_GRID_TP else all_pairs(grid):
        jobs.append(
            job_config(
                "strategy=replicated",
                f"topology=tp{tp}",
                f"topology.mem_layout={layout}",
                f"topology.io_backend={io}",
                f"model.kv_dtype={dtype}",
                f"workload.placement={placement}",
                f"strategy.chunk_pages={chunk}",
                *SMALL,
            )
        )
    return jobs


def page_copies(trace: list[dict], direction: str) -> dict[int, list[int]]:
    """Per unit, the transfer pages copied in order (a copy of n pages expands to n; a copy
    of several units, as chunked backups make, to each of them)."""
    per_unit: dict[int, list[int]] = {}
    for op in trace:
        if op["op"] == "copy" and op["direction"] == direction:
            for unit in op.get("units", [op.get("unit")]):
                per_unit.setdefault(unit, []).extend(range(op["first"], op["first"] + op["pages"]))
    return per_unit


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_replicated_matrix_is_bit_exact(tp: int) -> None:
    """tp x layouts x bf16/fp16/fp8 x placements x chunked/unchunked x io backends."""
    jobs = matrix(tp)
    ranks = launch(rankfns.run_jobs, jobs, tp, backend="gloo", timeout_s=120)
    assert ranks is not None
    for job_index, job in enumerate(jobs):
        reports = [ranks[r][job_index] for r in range(tp)]
        where = (
            job.topology.mem_layout,
            job.model.kv_dtype,
            job.workload.placement,
            job.strategy.config.chunk_pages,
            job.topology.io_backend,
        )
        assert all(r["verified"] for r in reports), (where, [r["mismatch"] for r in reports])
        moved = 32 * 320  # tokens x bytes per token of tiny_mla
        assert all(r["d2h_bytes"] == moved and r["h2d_bytes"] == moved for r in reports), where
        assert all(r["broadcast_send_bytes"] == r["broadcast_recv_bytes"] == 0 for r in reports)


def test_chunking_keeps_copies_bytes_and_order() -> None:
    """With chunk_pages=3 each unit copies the same pages in the same order, same bytes."""
    common = (
        "topology=tp2",
        "workload.placement=contiguous",
        "topology.io_backend=direct",
        "topology.mem_layout=layer_first",
        *SMALL,
    )
    jobs = [
        job_config(*common, "strategy.chunk_pages=0"),
        job_config(*common, "strategy.chunk_pages=3"),
    ]
    ranks = launch(rankfns.run_jobs, jobs, 2, backend="gloo", timeout_s=120)
    assert ranks is not None
    for rank in ranks:
        whole, chunked = rank[0]["trace"], rank[1]["trace"]
        assert page_copies(whole, "d2h") == page_copies(chunked, "d2h")
        assert sum(len(p) for p in page_copies(whole, "d2h").values()) == 5 * 8  # units x pages
        whole_ops = [o for o in whole if o["op"] == "copy" and o["direction"] == "d2h"]
        chunked_ops = [o for o in chunked if o["op"] == "copy" and o["direction"] == "d2h"]
        assert sum(o["bytes"] for o in whole_ops) == sum(o["bytes"] for o in chunked_ops)
        assert len(chunked_ops) > len(whole_ops)  # really issued in more batches
        assert all("units" in o for o in chunked_ops)  # each a page of every unit at once
        loads = [
            [o for o in t if o["op"] == "copy" and o["direction"] == "h2d"]
            for t in (whole, chunked)
        ]
        assert loads[0] == loads[1]


def test_bad_transfer_input_raises_and_leaves_pools_unchanged() -> None:
    for strategy in ("replicated", "rotating"):
        said = launch(
            rankfns.bad_input,
            job_config(f"strategy={strategy}", *SMALL),
            2,
            backend="gloo",
            timeout_s=60,
        )
        assert said is not None
        for messages in said:
            assert messages[-1] == "unchanged=True"
            text = "\n".join(messages[:-1])
            # 4 cases x (backup, load), then a load and a backup of host pages never allocated
            assert len(messages) == 11
            for refused in messages[8:10]:  # each refused, naming them (issue 49)
                assert "not allocated (never allocated by Engine.host_slots.alloc" in refused
                assert refused.endswith("or freed since): [9, 10]")
            assert "transfers move whole pages" in text
            assert "has slots outside" in text
            assert "pass one device slot per host slot" in text
            assert "names a page twice" in text


def test_chunked_backups_go_through_the_two_batch_buffers_in_turn() -> None:
    """Direct copies to a page_first_direct host: each batch is gathered into batch buffer
    0, 1, 0, ... and then moved in one DMA per run of host pages. The kernel backend gathers
    nothing: one launch per batch, device pages to host (the last case)."""
    cases = {
        ("direct", "page_first_direct", "contiguous"): 1,
        ("direct", "page_first_direct", "fragmented"): None,  # one per run of host pages
    }
    jobs = [
        job_config(
            "topology=tp2",
            f"topology.io_backend={io}",
            f"topology.mem_layout={layout}",
            f"workload.placement={placement}",
            "strategy.chunk_pages=3",
            *SMALL,
        )
        for io, layout, placement in [*cases, ("kernel", "layer_first", "fragmented")]
    ]
    ranks = launch(rankfns.run_jobs, jobs, 2, backend="gloo", timeout_s=120)
    assert ranks is not None
    for rank in ranks:
        *gathering, kernel = rank
        assert kernel["verified"]
        kernel_backup = [o for o in kernel["trace"] if o.get("direction") != "h2d"]
        assert [o["op"] for o in kernel_backup] == ["copy"] * 3  # a launch per batch
        assert [o["pages"] for o in kernel_backup] == [3, 3, 2]
        for (case, copies_per_batch), report in zip(cases.items(), gathering, strict=True):
            assert report["verified"], case
            backup = [o for o in report["trace"] if o.get("direction") != "h2d"]
            gathers = [o for o in backup if o["op"] == "batch_gather"]
            assert [g["buffer"] for g in gathers] == [0, 1, 0], case  # 8 pages in batches of 3
            assert [g["pages"] for g in gathers] == [3, 3, 2], case
            for g, nxt in zip(gathers, [*gathers[1:], None], strict=True):
                start = backup.index(g) + 1
                end = backup.index(nxt) if nxt is not None else len(backup)
                copies = [o for o in backup[start:end] if o["op"] == "copy"]
                assert all(c["units"] == g["units"] for c in copies), case
                assert sum(c["pages"] for c in copies) == g["pages"], case
                if copies_per_batch is not None:
                    assert len(copies) == copies_per_batch, case
