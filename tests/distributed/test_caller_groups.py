"""Engines on the caller's groups (`pipeline.create_engine(job, group=...)`), on gloo ranks:
a world of 4 holding two TP2 engines (DP replicas on the same model; pipeline stages of
different layer counts), every strategy, one L3 file store shared by both engines; a world of
2 holding two TP1 engines; a TP group whose rank is also in another group; a rank that never
calls create_engine, named; groups that do not fit refused before any group is made.

Each engine seeds its pages and names its L3 keys apart (`gridfns.round_trip`'s salt), so a
byte that crossed from the other engine fails the bit-exact checks on that rank.
"""

from __future__ import annotations

from pathlib import Path

import gridfns
import groupfns
import pytest

import pipeline
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

STRATEGIES = ("replicated", "single_source", "rotating")
"""Every strategy applies to an MLA model on tp2 (`hicache-pipeline explain`)."""


def cases(tp: int, store: Path, layers: int, strategies: tuple[str, ...]) -> list:
    """(case, job) per strategy: tiny_mla of `layers` layers, KV adopted per layer, one page
    a backup batch, written back to the file store in `store`."""
    found = []
    for strategy in strategies:
        case = gridfns.Case("tiny_mla", strategy, 1, "per_layer", "file", tp)
        job = pipeline.compose([*case.overrides(store), f"model.num_layers={layers}"])
        assert job.strategy.config.name == strategy, job.strategy.config.name
        found.append((case, job))
    return found


def test_two_tp2_engines_in_a_world_of_4_move_their_own_bytes(tmp_path: Path) -> None:
    replicas = groupfns.Layout(
        ranks=[[0, 1], [2, 3]],
        cases=[cases(2, tmp_path, 5, STRATEGIES) for _ in range(2)],
        cpu_groups=True,
    )
    # stage 1 makes and closes one engine more than stage 0: neither waits for the other
    stages = groupfns.Layout(
        ranks=[[0, 1], [2, 3]],
        cases=[cases(2, tmp_path, 3, STRATEGIES), cases(2, tmp_path, 2, (*STRATEGIES, "rotating"))],
    )
    ranks = launch(groupfns.on_caller_groups, [replicas, stages], 4, backend="gloo", timeout_s=60)
    assert (
        ranks
        == [[["", "", "", "usable"], ["", "", "", "usable"]]] * 2
        + [[["", "", "", "usable"], ["", "", "", "", "usable"]]] * 2
    )


def test_two_tp1_engines_in_a_world_of_2(tmp_path: Path) -> None:
    one = groupfns.Layout(ranks=[[0], [1]], cases=[cases(1, tmp_path, 5, ("replicated",))] * 2)
    ranks = launch(groupfns.on_caller_groups, [one], 2, backend="gloo", timeout_s=60)
    assert ranks == [[["", "usable"]]] * 2


def test_a_tp_group_whose_rank_is_in_another_group_made_before_it(tmp_path: Path) -> None:
    # rank 1 holds one group more than rank 0 when the engine makes its own: torch's name
    # for a group made with local synchronization counts them, so they met nowhere
    found = cases(2, tmp_path, 3, ("rotating", "replicated"))
    ranks = launch(groupfns.beside_another_group, found, 3, backend="gloo", timeout_s=60)
    assert ranks == [["", "", "usable"], ["", "", "usable", "usable"], ["usable"]]


def test_a_rank_that_never_calls_create_engine_is_named() -> None:
    job = pipeline.compose(["model=tiny_mla", "topology=tp2", "runtime.timeout_s=3"])
    ranks = launch(groupfns.one_rank_missing, job, 2, backend="gloo", timeout_s=60)
    assert ranks is not None
    first, second = ranks
    assert "create_engine on ranks [0, 1]: rank(s) 1 did not call it within " in first["said"]
    assert "runtime.timeout_s=3 s" in first["said"]
    assert "create_engine is a collective over the group" in first["said"]
    assert "rank 1 has made 0" in first["said"], first
    assert (first["again"], second) == ("made", {"said": "", "again": "made"})


def test_groups_that_do_not_fit_are_refused() -> None:
    job = pipeline.compose(["model=tiny_mla", "topology=tp1", "topology.device=cpu"])
    ranks = launch(groupfns.refusals, job, 2, backend="gloo", timeout_s=60)
    assert ranks is not None
    for rank, (whole, other_cpu, default) in enumerate(ranks):
        assert whole == (
            "group has 2 ranks [0, 1] but topology.tp_size=1: pass the attention-TP group (the "
            "ranks that hold the same KV), or compose the job with its size"
        )
        assert other_cpu == (
            f"cpu_group has ranks [0, 1] but group has [{rank}]: pass a gloo group over the "
            "same ranks, or none (the engine makes its own)"
        )
        assert default.startswith("2 ranks joined but topology.tp_size=1: "), default
