"""single_source and rotating on real gloo ranks: bit-exact, the bytes each rank moves, the
host capacity they buy, negative controls, layer-wise overlap and ordering safety."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import rankfns
from conftest import all_pairs, covering, job_config

from pipeline.core.checks import ConfigError
from pipeline.jobs.launch import launch
from pipeline.jobs.spawn import RankFailure

pytestmark = pytest.mark.distributed

IO_LAYOUTS = (
    ("direct", "page_first_direct"),
    ("kernel", "layer_first"),
    ("kernel", "page_first"),
    ("kernel", "page_first_direct"),
)
SMALL = ("workload.num_tokens=32", "workload.device_tokens=128", "workload.cycles=1")
GOLDEN = Path(__file__).parent.parent / "golden"


DENSE_GRID = ("topology=tp2", 2)
"""The topology and tp where every three factors' settings meet in some job (a covering of
strength 3: 64 jobs of the product become about a third); elsewhere every two factors'
settings do (all_pairs), which keeps the suite inside CI's time on 2 cores."""


def dedup_matrix(topology: str, tp: int) -> list[dict]:
    jobs = []
    grid = list(
        itertools.product(
            ("single_source", "rotating"),
            ("tiny_mla", "tiny_dsa"),
            ("contiguous", "fragmented"),
            (0, 3),
            IO_LAYOUTS,
        )
    )
    combos = covering(grid, 3) if (topology, tp) == DENSE_GRID else all_pairs(grid)
    for i, (strategy, model, placement, chunk, (io, layout)) in enumerate(combos):
        jobs.append(
            job_config(
                f"strategy={strategy}",
                f"model={model}",
                topology,
                f"topology.tp_size={tp}",
                f"topology.io_backend={io}",
                f"topology.mem_layout={layout}",
                f"workload.placement={placement}",
                f"strategy.chunk_pages={chunk}",
                # alternate both ordering designs; small staging splits layers into chunks
                f"strategy.ordering={('gate', 'forward_stream')[i % 2]}",
                f"strategy.staging_bytes={(1 << 20, 256)[i % 2]}",
                "strategy.verify_every=1",
                *SMALL,
            )
        )
    return jobs


def check_bytes(job: dict, reports: list[dict], group: list[int]) -> None:
    """Rotating moves the replicated total once over the group; single_source on the source."""
    total = sum(u for u in [32 * (320 if job.model.name == "tiny_mla" else 272)])
    mine = [reports[r] for r in group]
    assert sum(r["d2h_bytes"] for r in mine) == total
    assert sum(r["h2d_bytes"] for r in mine) == total
    if job.strategy.config.name == "single_source":
        assert mine[0]["h2d_bytes"] == total and all(r["h2d_bytes"] == 0 for r in mine[1:])
        assert all(r["broadcast_recv_bytes"] == total for r in mine[1:])
    else:
        assert max(r["h2d_bytes"] for r in mine) < total
        assert sum(r["broadcast_send_bytes"] for r in mine) == total


@pytest.mark.parametrize(
    ("topology", "tp", "groups"),
    [
        ("topology=tp2", 2, [[0, 1]]),
        ("topology=tp2", 3, [[0, 1, 2]]),
        ("topology=tp4", 4, [[0, 1, 2, 3]]),
        ("topology=tp4_dp2", 4, [[0, 1], [2, 3]]),
    ],
)
def test_dedup_matrix_is_bit_exact(topology: str, tp: int, groups: list[list[int]]) -> None:
    jobs = dedup_matrix(topology, tp)
    ranks = launch(rankfns.run_jobs, jobs, tp, backend="gloo", timeout_s=120)
    assert ranks is not None
    for i, job in enumerate(jobs):
        reports = [ranks[r][i] for r in range(tp)]
        assert all(r["verified"] for r in reports), (job.strategy.config, job.topology)
        for group in groups:
            check_bytes(job, reports, group)


@pytest.mark.slow
def test_rotating_on_eight_ranks() -> None:
    jobs = [
        job_config(
            "strategy=rotating",
            "topology=tp8",
            "model=tiny_dsa",
            "model.num_layers=9",
            f"workload.placement={p}",
            *SMALL,
        )
        for p in ("contiguous", "fragmented")
    ]
    ranks = launch(rankfns.run_jobs, jobs, 8, backend="gloo", timeout_s=300)
    assert ranks is not None
    assert all(r[i]["verified"] for r in ranks for i in range(len(jobs)))


def test_host_capacity_grows_or_memory_shrinks_by_group_size() -> None:
    four_layers = ("model.num_layers=4", "topology=tp4", *SMALL)
    jobs = [
        job_config("strategy=replicated", *four_layers),
        job_config("strategy=rotating", *four_layers),
        job_config("strategy=rotating", "strategy.keep_capacity=true", *four_layers),
    ]
    ranks = launch(rankfns.run_jobs, jobs, 4, backend="gloo", timeout_s=120)
    assert ranks is not None
    for rank in ranks:
        replicated, grown, kept = rank
        assert grown["host_capacity_tokens"] == 4 * replicated["host_capacity_tokens"]
        assert grown["host_pool_bytes"] == replicated["host_pool_bytes"]
        assert kept["host_capacity_tokens"] == replicated["host_capacity_tokens"]
        assert kept["host_pool_bytes"] * 4 == replicated["host_pool_bytes"]
        assert all(r["verified"] for r in rank)


def per_unit(trace: list[dict]) -> list[dict]:
    """The trace with each copy of several units (a chunked backup's batch, all of one pool
    kind, so equal bytes each) split into that unit's copy, in unit order; without batch
    gathers (device-side, and newer than the foundation)."""
    ops = []
    for op in trace:
        if op["op"] == "batch_gather":
            continue
        if "units" not in op:
            ops.append(op)
            continue
        units = op["units"]
        fields = {k: v for k, v in op.items() if k not in ("units", "bytes")}
        for unit in units:
            ops.append({**fields, "unit": unit, "bytes": op["bytes"] // len(units)})
    return ops


def _order(op: dict) -> tuple:
    return (op["rank"], op["op"], op.get("direction", ""), op.get("unit", -1), op.get("first", -1))


def test_replicated_trace_equals_the_foundation() -> None:
    """Field by field against traces recorded from the foundation's replicated path (unit by
    unit: the chunked backup now copies each batch's units in one call)."""
    common = (
        "model=tiny_dsa",
        "workload.placement=fragmented",
        "workload.num_tokens=32",
        "strategy.load_group_bytes=0",
    )
    golden = {
        "replicated_direct.jsonl": job_config(
            *common, "topology.io_backend=direct", "topology.mem_layout=page_first_direct"
        ),
        "replicated_kernel.jsonl": job_config(
            *common, "topology.mem_layout=page_first", "strategy.chunk_pages=3"
        ),
    }
    ranks = launch(rankfns.run_jobs, list(golden.values()), 2, backend="gloo", timeout_s=120)
    assert ranks is not None
    for i, name in enumerate(golden):
        expected = [json.loads(line) for line in (GOLDEN / name).read_text().splitlines()]
        got = [{"rank": r, **op} for r in range(2) for op in per_unit(ranks[r][i]["trace"])]
        # a backup's step now covers every unit, so its copies come page by page across the
        # units: the same copies as the foundation's, in another order
        assert sorted(got, key=_order) == sorted(expected, key=_order), name
        assert all(ranks[r][i]["verified"] for r in range(2))


@pytest.mark.parametrize("strategy", ["single_source", "rotating"])
def test_skipped_exchange_on_one_rank_fails_verification(strategy: str) -> None:
    cfg = job_config(f"strategy={strategy}", "strategy.verify_every=1", *SMALL)
    said = launch(rankfns.negative_control, (cfg, "skip_scatter"), 2, backend="gloo", timeout_s=60)
    assert said is not None
    assert all("verify: rank 1 loaded different bytes than rank 0" in s for s in said), said


def test_diverging_host_page_fails_verification_replicated() -> None:
    cfg = job_config("strategy=replicated", "strategy.verify_every=1", *SMALL)
    said = launch(rankfns.negative_control, (cfg, "diverge_host"), 2, backend="gloo", timeout_s=60)
    assert said is not None
    assert all("kv layer 0, transfer page 0" in s for s in said), said


def test_diverging_host_page_on_the_owner_fails_the_bit_exact_check() -> None:
    """All ranks receive the owner's diverged page: digests agree, the contents do not."""
    cfg = job_config("strategy=rotating", "strategy.verify_every=1", *SMALL)
    said = launch(rankfns.negative_control, (cfg, "diverge_host"), 2, backend="gloo", timeout_s=60)
    assert said is not None
    assert said == [
        f"rank {r}: kv layer 0 differs at transfer page 0 (device page 8); 1 pages differ"
        for r in range(2)
    ]


@pytest.mark.parametrize(
    ("strategy", "ordering"),
    [
        ("replicated", "gate"),
        ("rotating", "gate"),
        ("rotating", "forward_stream"),
        ("single_source", "forward_stream"),
    ],
)
def test_forward_starts_on_layer_0_before_the_last_layer_arrives(
    strategy: str, ordering: str
) -> None:
    # each layer on its own (strategy.load_group_bytes=0): layer-wise overlap is the subject
    groups = "strategy.load_group_bytes=0"
    cfg = job_config(f"strategy={strategy}", f"strategy.ordering={ordering}", groups, *SMALL)
    results = launch(rankfns.overlap, cfg, 2, backend="gloo", timeout_s=60)
    assert results is not None
    for r in results:
        assert r == {"layer0_ready": True, "last_ready_early": False, "mismatch": ""}


def test_a_failing_rank_is_reported_with_its_traceback() -> None:
    with pytest.raises(RankFailure, match=r"(?s)rank 1 failed.*rank 1 gives up"):
        launch(rankfns.fail_on_rank_1, None, 2, backend="gloo", timeout_s=60)


def test_a_config_mistake_never_reaches_a_rank() -> None:
    """What a rank would have found (pages that do not fit) is refused in the parent."""
    with pytest.raises(ConfigError, match="device_tokens=7 must be a multiple of page_size"):
        job_config(*SMALL, "workload.device_tokens=7")


def test_adopted_kv_round_trips_for_every_strategy_chunked_or_not_on_two_ranks() -> None:
    """The public API's grid on two ranks: every strategy, chunk_pages 0 / 2 / 3, one tensor
    per layer or views of one buffer, each host layout (one tensor per layer with chunking
    failed 8 of 8 before: the plan gathered batches that only stacked pools could give)."""
    layouts = [
        ("topology.mem_layout=layer_first",),
        ("topology.mem_layout=page_first_direct", "topology.io_backend=direct"),
    ]
    cases = [
        (job_config(f"strategy={s}", "topology=tp2", f"strategy.chunk_pages={c}", *lay), stacked)
        for s, c, lay, stacked in itertools.product(
            ("replicated", "single_source", "rotating"), (0, 2, 3), layouts, (False, True)
        )
    ]
    reports = launch(rankfns.adopted_round_trips, cases, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    for rank, found in enumerate(reports):
        bad = [(i, f) for i, f in enumerate(found) if f]
        assert bad == [], (rank, bad)
