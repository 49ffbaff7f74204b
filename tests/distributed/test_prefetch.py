"""Prefetch on 2 CPU ranks with a real file store, one rank's reader really slowed (its I/O
threads held busy): under each `storage.prefetch_policy` both ranks take the same leading
pages, load them bit-exact, leave the rest of the device untouched and give the slots of the
pages not taken back to the free list; `storage.min_hit_pages` turns a short hit into none.
One launch per strategy runs all its cases (each on its own engine and folder)."""

from __future__ import annotations

from pathlib import Path

import prefetchfns
import pytest
from conftest import job_config

from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

SMALL = ("workload.num_tokens=32", "workload.device_tokens=256", "storage.io_threads=2")
CASES = [
    # (policy knobs, how the slow rank is released, the pages both ranks take)
    (("storage.prefetch_policy=wait_complete",), "timer", 8),
    (("storage.prefetch_policy=timeout", "storage.prefetch_timeout_s=60"), "timer", 8),
    (("storage.prefetch_policy=timeout", "storage.prefetch_timeout_s=0.2"), "after", 0),
    (("storage.prefetch_policy=best_effort",), "after", 0),
    (("storage.prefetch_policy=best_effort",), "ready", 8),
    # fewer pages than storage.min_hit_pages: the lookup and the load report none
    (("storage.prefetch_policy=wait_complete", "storage.min_hit_pages=9"), "timer", 0),
]


@pytest.mark.parametrize("strategy", ["replicated", "single_source", "rotating"])
def test_every_rank_takes_the_same_pages(tmp_path: Path, strategy: str) -> None:
    slow = 0 if strategy == "single_source" else 1  # a rank that reads (single_source: 0 only)
    jobs = [
        job_config(
            "topology=tp2",
            f"strategy={strategy}",
            "storage=file",
            f"storage.path={tmp_path / str(i)}",
            *SMALL,
            *knobs,
        )
        for i, (knobs, _, _) in enumerate(CASES)
    ]
    for i in range(len(CASES)):
        (tmp_path / str(i)).mkdir()
    cases = [(job, slow, release) for job, (_, release, _) in zip(jobs, CASES, strict=True)]
    said = launch(prefetchfns.prefetched, cases, 2, backend="gloo", timeout_s=120, job_s=600)
    assert said is not None
    for i, (knobs, release, pages) in enumerate(CASES):
        case = (strategy, knobs, release)
        assert [r[i]["hits"] for r in said] == [pages, pages], case
        for rank in said:
            s = rank[i]
            assert s["found"] == (0 if "storage.min_hit_pages=9" in knobs else 8), case
            assert s["loaded"] == "", case  # bit-exact where taken
            assert s["rest_untouched"], case  # nothing loaded past the agreed pages
            assert s["slots_back"] == 0, case  # the slots of the pages not taken are free
            assert s["stats"]["hicache_fetch_seconds_count"] == 1, case


@pytest.mark.parametrize("strategy", ["replicated", "rotating"])
def test_a_load_refused_on_one_rank_is_refused_on_every_rank_and_the_prefetch_stays(
    tmp_path: Path, strategy: str
) -> None:
    job = job_config(
        "topology=tp2",
        f"strategy={strategy}",
        "storage=file",
        f"storage.path={tmp_path}",
        "storage.prefetch_policy=wait_complete",
        *SMALL,
    )
    said = launch(prefetchfns.refused_then_loaded, job, 2, backend="gloo", timeout_s=120)
    assert said is not None
    assert said[1]["refused"].startswith("device_indices has slots outside")
    assert said[0]["refused"] == f"load_prefetched refused on another rank: {said[1]['refused']}"
    for rank in said:
        assert rank["untouched"]  # no rank loaded a page before the refusal
        assert (rank["hits"], rank["loaded"]) == (8, "")  # the prefetch loads after it
        assert "a prefetch of 8 pages" in rank["freed"] and "Prefetch.cancel" in rank["freed"]
    assert said[0]["digest"] == said[1]["digest"]
