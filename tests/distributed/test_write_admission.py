"""Write admission on real gloo ranks (`storage.write_admission=after_hits`): under every
strategy a one-off prefix is never written to the file store and a repeated one is, every rank
of the group deciding alike from the lookups it took part in; and the write-back queue's bound
(`storage.write_back_queue_pages`): a write-back past it is dropped on every rank alike."""

from __future__ import annotations

from pathlib import Path

import l3fns
import pytest
from conftest import job_config

from pipeline.config.job import Job
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

STRATEGIES = ("replicated", "single_source", "rotating")


def file_store_job(tmp_path: Path, strategy: str, *overrides: str) -> Job:
    """A TP2 tiny_dsa job of `strategy` on a file store in a folder of its own."""
    folder = tmp_path / strategy
    folder.mkdir(parents=True)
    return job_config(
        f"strategy={strategy}",
        "model=tiny_dsa",
        "topology=tp2",
        "storage=file",
        f"storage.path={folder}",
        *overrides,
    )


def test_after_two_hits_only_a_repeated_prefix_is_written(tmp_path: Path) -> None:
    after = ("storage.write_admission=after_hits", "storage.admit_after_hits=2")
    jobs = [file_store_job(tmp_path, strategy, *after) for strategy in STRATEGIES]
    control = file_store_job(tmp_path / "always", "replicated")  # the default: every page
    jobs.append(control)
    ranks = launch(l3fns.admitted, jobs, 2, backend="gloo", timeout_s=120)
    assert ranks is not None
    pages = l3fns.GRID_PAGES
    for i, strategy in enumerate(STRATEGIES):
        reports = [ranks[r][i] for r in range(2)]
        assert reports[0] == reports[1], strategy  # every rank decided alike
        assert reports[0] == {
            "seen": [0, 0, 0],
            "admitted": [0, pages],  # the first write-back stored nothing
            "declined": 2 * pages,
            "found": [0, pages],  # the one-off prefix was never written
        }, strategy
    always = [ranks[r][-1] for r in range(2)]
    assert (
        always[0]
        == always[1]
        == {
            "seen": [0, 0, pages],  # the repeated prefix was written at once
            "admitted": [2 * pages, 3 * pages],
            "declined": 0,
            "found": [pages, pages],
        }
    )


def test_a_write_back_past_the_queue_bound_is_dropped_alike_and_the_next_stored(
    tmp_path: Path,
) -> None:
    """With room for one write-back's pages, a second submitted before the first is released
    stores nothing (counted as dropped) on both ranks, under every strategy (rotating: the
    owners send no layers for it); after the polls, a third is stored."""
    bound = f"storage.write_back_queue_pages={l3fns.GRID_PAGES}"
    jobs = [file_store_job(tmp_path, strategy, bound) for strategy in STRATEGIES]
    ranks = launch(l3fns.queue_bounded, jobs, 2, backend="gloo", timeout_s=120)
    assert ranks is not None
    pages = l3fns.GRID_PAGES
    for i, strategy in enumerate(STRATEGIES):
        reports = [ranks[r][i] for r in range(2)]
        assert reports[0] == reports[1], strategy
        assert reports[0] == {
            "admitted": 2 * pages,
            "dropped": pages,
            "found": [pages, 0, pages],
        }, strategy
