"""The host-slot lifecycle on 2 gloo ranks, through the engine's public calls only: allocated
slots back up and write back, the same slots are reused for a load_from_l3 (bit-exact), freed
slots are handed out again, and a double free or an out-of-range slot is refused naming the
argument; every rank ends with the same replicated state."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import slotfns
from conftest import job_config

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("strategy", ["replicated", "rotating"])
def test_host_slots_are_allocated_reused_for_l3_and_freed_alike_on_every_rank(
    strategy: str, tmp_path: Path
) -> None:
    job = job_config(f"strategy={strategy}", "topology=tp2", "storage=file")
    job = dataclasses.replace(job, storage=StorageConfig(kind=StorageKind.file, path=str(tmp_path)))
    reports = launch(slotfns.host_slot_lifecycle, job, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    size = job.model.page_size
    for r in reports:
        assert r["host"] == list(range(2 * size))  # the lowest free pages, in token slots
        assert "hold data" in r["held"]  # before reuse: load_from_l3 would overwrite them
        assert (r["hits"], r["loaded"]) == (2, "")
        assert r["again"] == r["host"] and r["free_after"]
        assert r["double_free"].startswith("host_slots names host pages that are not allocated")
        assert r["out_of_range"].startswith("host_slots has slots outside 0..")
        assert "host_slots names host pages that are not allocated" in r["reuse_free"]
        assert r["partial"].startswith(f"num_slots={size + 1} must be a positive multiple")
        assert "host slots are free" in r["too_many"]
    assert reports[0]["digest"] == reports[1]["digest"]
