"""`plan` says, without moving a byte, what each rank will move; `run` moves it and counts what
it issued (the engine's op trace). They must agree, rank by rank, for every strategy on every
topology that runs on gloo, with and without a store: a plan that drifted from the stages
would tell an operator the wrong bytes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import job_config

from pipeline.jobs.plan_report import plan_report

pytestmark = pytest.mark.distributed

BYTES = (
    "d2h_bytes",
    "h2d_bytes",
    "broadcast_send_bytes",
    "broadcast_recv_bytes",
    "l3_write_bytes",
    "l3_send_bytes",
    "l3_read_bytes",
)


def planned_ops(row: dict) -> dict[str, int]:
    """A plan row's copies and collectives of one backup and one load, by kind."""
    ops: dict[str, int] = {}
    for direction in ("backup_ops", "load_ops"):
        for kind, n in row[direction].items():
            ops[kind] = ops.get(kind, 0) + n
    return {kind: n for kind, n in ops.items() if n}


STRATEGIES = ("replicated", "single_source", "rotating")
PAIRS = [
    (topology, strategy)
    for topology in ("tp1", "tp2", "tp4", "tp4_dp2")
    for strategy in STRATEGIES
    if topology != "tp1" or strategy == "replicated"  # at tp1 the others fall back to it
]
CASES = [
    ("tp1", "replicated", "none"),
    *[
        (topology, strategy, ("file", "none")[i % 2])
        for i, (topology, strategy) in enumerate(PAIRS)
    ],
]
"""Each topology x strategy with one store, the stores taking turns (every pair of topology x
strategy, topology x store and strategy x store is covered): each case launches its ranks,
the suite's most expensive step on a 2-core machine; the rest of the grid runs with -m slow."""
REST = [
    (topology, strategy, storage)
    for topology, strategy in PAIRS
    for storage in ("none", "file")
    if (topology, strategy, storage) not in CASES
]
WIDE = ("tp8", "tp8_dcp4", "h200x8_direct", "h200x8_dp8", "pd_decode_tp8")
"""The other topology files that run on gloo (two_nodes_tp16 needs two nodes): 8 ranks each,
so with -m slow, and each strategy with one store, the stores taking turns."""
WIDE_CASES = [
    (topology, strategy, ("none", "file")[(i + j) % 2])
    for i, topology in enumerate(WIDE)
    for j, strategy in enumerate(STRATEGIES)
]


@pytest.mark.parametrize(("topology", "strategy", "storage"), CASES)
def test_plan_is_what_each_rank_issues(topology: str, strategy: str, storage: str) -> None:
    check_plan_against_run(topology, strategy, storage)


@pytest.mark.slow
@pytest.mark.parametrize(("topology", "strategy", "storage"), REST + WIDE_CASES)
def test_plan_is_what_each_rank_issues_on_the_rest_of_the_grid(
    topology: str, strategy: str, storage: str
) -> None:
    check_plan_against_run(topology, strategy, storage)


def check_plan_against_run(topology: str, strategy: str, storage: str) -> None:
    overrides = [f"topology={topology}", f"strategy={strategy}", f"storage={storage}"]
    overrides.append("workload.cycles=1")  # the plan is one backup and one load-back
    planned = plan_report(job_config(*overrides))["ranks"]
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *overrides, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout)["ranks"]
    assert [p["rank"] for p in planned] == [r["rank"] for r in ran]
    for plan, run in zip(planned, ran, strict=True):
        for key in BYTES:  # every byte, the store's included
            assert plan.get(key, 0) == run.get(key, 0), (plan["rank"], key)
        # the copies and collectives (the store's own reads and writes are per object: the
        # plan counts their bytes above)
        issued = {k: n for k, n in run["ops_by_kind"].items() if not k.startswith("l3_")}
        assert planned_ops(plan) == issued, plan["rank"]
