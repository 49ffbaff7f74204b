"""Prefetch on 2 CPU ranks with a real file store, one rank's reader really slowed (its I/O
threads held busy): under each `storage.prefetch_policy` both ranks take the same leading
pages, load them bit-exact, leave the rest of the device untouched and give the slots of the
pages not taken back to the free list; `storage.min_hit_pages` turns a short hit into none."""

from __future__ import annotations

from pathlib import Path

import prefetchfns
import pytest
from conftest import job_config

from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

SMALL = ("workload.num_tokens=32", "workload.device_tokens=256", "storage.io_threads=2")


def prefetched(tmp_path: Path, strategy: str, release: str, *knobs: str) -> list[dict]:
    job = job_config(
        "topology=tp2",
        f"strategy={strategy}",
        "storage=file",
        f"storage.path={tmp_path}",
        *SMALL,
        *knobs,
    )
    slow = 0 if strategy == "single_source" else 1  # a rank that reads (single_source: 0 only)
    said = launch(prefetchfns.prefetched, (job, slow, release), 2, backend="gloo", timeout_s=120)
    assert said is not None
    return said


CASES = [
    # (policy knobs, how the slow rank is released, the pages both ranks take)
    (("storage.prefetch_policy=wait_complete",), "timer", 8),
    (("storage.prefetch_policy=timeout", "storage.prefetch_timeout_s=60"), "timer", 8),
    (("storage.prefetch_policy=timeout", "storage.prefetch_timeout_s=0.2"), "after", 0),
    (("storage.prefetch_policy=best_effort",), "after", 0),
    (("storage.prefetch_policy=best_effort",), "ready", 8),
]


@pytest.mark.parametrize("strategy", ["replicated", "single_source", "rotating"])
@pytest.mark.parametrize(("knobs", "release", "pages"), CASES)
def test_every_rank_takes_the_same_pages(
    tmp_path: Path, strategy: str, knobs: tuple[str, ...], release: str, pages: int
) -> None:
    said = prefetched(tmp_path, strategy, release, *knobs)
    assert [s["hits"] for s in said] == [pages, pages]
    for s in said:
        assert s["found"] == 8
        assert s["loaded"] == ""  # bit-exact where taken
        assert s["rest_untouched"]  # nothing loaded past the agreed pages, on any rank
        assert s["slots_back"] == 0  # the slots of the pages not taken are free again
        assert s["stats"]["hicache_fetch_seconds_count"] == 1


def test_a_hit_shorter_than_min_hit_pages_is_none(tmp_path: Path) -> None:
    said = prefetched(
        tmp_path,
        "replicated",
        "timer",
        "storage.prefetch_policy=wait_complete",
        "storage.min_hit_pages=9",
    )
    for s in said:
        assert (s["found"], s["hits"], s["slots_back"]) == (0, 0, 0)
        assert s["rest_untouched"]
