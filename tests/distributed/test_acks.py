"""The ack poll and its idle-sync skip on real gloo ranks: same decisions, same state, and the
wrong predicate caught."""

from __future__ import annotations

import dataclasses

import pytest
import rankfns
from conftest import job_config

from pipeline.config.drive_schemas import IdlePredicate, SimulateConfig
from pipeline.jobs.launch import launch
from pipeline.jobs.simulate import simulate_rank, summarize
from pipeline.jobs.spawn import RankFailure

pytestmark = pytest.mark.distributed


def simulated(ranks: int, predicate: IdlePredicate = IdlePredicate.ledger, **knobs) -> dict:
    sim = SimulateConfig(seeds=[0, 1, 2], steps=120, predicate=predicate, **knobs)
    job = dataclasses.replace(job_config("topology=tp2", f"topology.tp_size={ranks}"), simulate=sim)
    result = launch(simulate_rank, job, ranks, backend="gloo", timeout_s=60)
    assert result is not None
    return summarize(result)


@pytest.mark.parametrize("ranks", [2, 4])
def test_every_rank_decides_the_same_and_skip_changes_nothing(ranks: int) -> None:
    result = simulated(ranks)
    assert result["ok"], result
    for run in result["runs"]:
        assert run["ranks_agree"] and run["skip_on_equals_off"]
        assert run["skipped"] > 0  # the skip really saved reduces
        assert run["reduces_on"] + run["skipped"] == run["reduces_off"]


@pytest.mark.slow
def test_eight_ranks_agree() -> None:
    assert simulated(8)["ok"]


def test_without_debug_checks_the_outcome_is_the_same() -> None:
    assert simulated(2, debug_consensus=False)["ok"]


def test_a_predicate_on_rank_local_event_status_is_caught() -> None:
    with pytest.raises(RankFailure, match="rank_consensus: ranks disagree on the idle-sync skip"):
        simulated(2, predicate=IdlePredicate.event_status)


def test_the_forced_sync_compares_replicated_state() -> None:
    cfg = job_config(
        "strategy.idle_sync_skip.enabled=true",
        "strategy.idle_sync_skip.max_skips=2",
        "workload.device_tokens=128",
        "workload.num_tokens=32",
    )
    said = launch(rankfns.diverged_state, (cfg, 2), 2, backend="gloo", timeout_s=60)
    assert said is not None
    assert all("ranks hold different replicated state" in s for s in said), said
