"""The cost model's arithmetic on cases worked out by hand, and what strategy=auto picks on the
rows BENCHMARKS.md measured."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import job_config

from pipeline.config.eligibility import dedup_expected_to_win
from pipeline.config.links import links_of
from pipeline.core.checks import ConfigError
from pipeline.core.cost import Case, Links, estimate
from pipeline.core.model import KvDtype, ModelGeometry, ModelKind
from pipeline.core.ownership import Ownership
from pipeline.core.storage import StorageKind
from pipeline.core.topology import IoBackend, MemLayout, Topology
from pipeline.jobs.cost_report import plan_estimate

# 4 layers of 1000 B per page of one token: 1e6 tokens are 1e9 B (1 GB) per layer.
MODEL = ModelGeometry(
    name="hand", kind=ModelKind.mla, num_layers=4, kv_row_bytes=1000, kv_dtype=KvDtype.fp8,
    page_size=1,
)  # fmt: skip
DIRECT = Topology(
    name="tp2", tp_size=2, io_backend=IoBackend.direct, mem_layout=MemLayout.page_first_direct
)
ROUND = Links(
    machine="round numbers",
    h2d_gbps=1.0,
    d2h_gbps=1.0,
    h2d_kernel_gbps=0.5,
    d2h_kernel_gbps=0.5,
    broadcast_gbps=2.0,
    internode_gbps=0.25,
    copy_call_us=1000.0,  # 1 ms a unit: the issue term shows in every sum
    file_read_gbps=1.0,
    file_read_aggregate_gbps=1.5,
    file_write_gbps=0.5,
    mooncake_read_gbps=1.0,
    mooncake_read_aggregate_gbps=1.0,
    mooncake_write_gbps=1.0,
)
TOKENS = 1_000_000


def case(**changes: object) -> Case:
    return dataclasses.replace(Case(model=MODEL, topology=DIRECT, tokens=TOKENS), **changes)


def test_a_replicated_rank_copies_every_layer_over_its_own_link() -> None:
    e = estimate(case(), Ownership.replicated, ROUND)
    # 4 units: 4 x 1 ms of issue + 4 GB at 1 GB/s; no exchange
    assert e.backup.seconds == pytest.approx(4.004) and e.backup.bound == "d2h"
    assert e.load.seconds == pytest.approx(4.004) and e.load.bound == "h2d"
    assert [r.host_link_bytes for r in e.ranks] == [4 * 10**9] * 2
    assert [r.broadcast_received_bytes for r in e.ranks] == [0, 0]
    assert e.l3_load is None and e.write_back is None


def test_rotating_halves_the_copies_and_overlaps_the_broadcasts_of_dma_copies() -> None:
    e = estimate(case(), Ownership.rotating, ROUND)
    assert e.backup.seconds == pytest.approx(2.002)  # 2 units each
    # copies 2.002 s; broadcasts 4 GB at 2 GB/s = 2 s under them, the last unit's 0.5 s after
    assert e.load.seconds == pytest.approx(2.002 + 0.5) and e.load.bound == "h2d"
    assert [(r.broadcast_sent_bytes, r.broadcast_received_bytes) for r in e.ranks] == [
        (2 * 10**9, 2 * 10**9)
    ] * 2


def test_single_source_copies_everything_on_one_rank_then_broadcasts() -> None:
    e = estimate(case(), Ownership.single_source, ROUND)
    assert e.load.seconds == pytest.approx(4.004 + 0.5)
    assert [r.host_link_bytes for r in e.ranks] == [4 * 10**9, 0]


def test_kernel_copies_of_fragmented_pages_do_not_overlap_the_broadcasts() -> None:
    kernel = dataclasses.replace(
        DIRECT, io_backend=IoBackend.kernel, mem_layout=MemLayout.layer_first
    )
    e = estimate(case(topology=kernel, fragmented=True), Ownership.rotating, ROUND)
    # 2 ms issue + 2 GB at 0.5 GB/s + 2 s of broadcasts, one after the other
    assert e.load.seconds == pytest.approx(0.002 + 4 + 2) and e.load.bound == "h2d kernel"
    # consecutive pages outside graphs are one DMA each, inside graphs kernels again
    assert estimate(case(topology=kernel), Ownership.rotating, ROUND).load.bound == "h2d"
    graphed = estimate(case(topology=kernel, graphs=True), Ownership.rotating, ROUND)
    assert graphed.load.seconds == pytest.approx(6.002)


def test_a_slow_broadcast_bounds_the_load_and_the_group_across_nodes_is_slower() -> None:
    slow = dataclasses.replace(ROUND, broadcast_gbps=0.5)
    e = estimate(case(), Ownership.rotating, slow)
    assert e.load.seconds == pytest.approx(8 + 2) and e.load.bound == "broadcast"  # 4 GB / 0.5
    nodes = dataclasses.replace(DIRECT, tp_size=2, nnodes=2)
    across = estimate(case(topology=nodes), Ownership.single_source, ROUND)
    assert across.load.seconds == pytest.approx(16 + 4)  # 4 GB at 0.25, last unit's after


def test_loads_from_l3_share_the_store_between_readers_then_load_the_last_window() -> None:
    store = case(store=StorageKind.file)
    replicated = estimate(store, Ownership.replicated, ROUND)
    # two readers of 4 GB at min(1, 1.5 / 2) GB/s, then the one window's load of 4.004 s
    assert replicated.l3_load is not None
    assert replicated.l3_load.seconds == pytest.approx(4 / 0.75 + 4.004)
    assert replicated.l3_load.bound == "l3 read"
    single = estimate(store, Ownership.single_source, ROUND).l3_load
    assert single is not None and single.seconds == pytest.approx(4 / 1 + 4.504)  # one reader
    rotating = estimate(store, Ownership.rotating, ROUND).l3_load
    assert rotating is not None and rotating.seconds == pytest.approx(2 / 0.75 + 2.502)
    windowed = estimate(
        case(store=StorageKind.file, window_pages=TOKENS // 4), Ownership.replicated, ROUND
    )
    assert windowed.l3_load is not None
    assert windowed.l3_load.seconds == pytest.approx(4 / 0.75 + 4.004 / 4)
    assert replicated.write_back is not None and replicated.write_back.seconds == pytest.approx(8)


def test_the_dedup_rule_passes_where_dedup_wins_and_says_what_to_change_where_it_loses() -> None:
    replicated = estimate(case(), Ownership.replicated, ROUND)
    wins = dedup_expected_to_win(
        "rotating", estimate(case(), Ownership.rotating, ROUND), replicated, case()
    )
    assert wins.passed and wins.name == "dedup_expected_to_win"
    slow = dataclasses.replace(ROUND, broadcast_gbps=0.5)
    loses = dedup_expected_to_win(
        "rotating",
        estimate(case(), Ownership.rotating, slow),
        estimate(case(), Ownership.replicated, slow),
        case(),
    )
    assert not loses.passed
    assert "broadcast is slower" in loses.message and "group of 2" in loses.message
    assert "strategy=replicated or strategy=auto" in loses.message


def test_links_refuse_a_speed_that_is_not_positive_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="h2d_gbps=0 must be a number > 0"):
        dataclasses.replace(ROUND, h2d_gbps=0)


H200_TP2 = ("model=deepseek_v3", "topology=tp2", "runtime.links=h200")
# (overrides, the strategy measured fastest, its measured load ms): BENCHMARKS.md, 923a77f
DMA = ("topology.io_backend=direct", "topology.mem_layout=page_first_direct")
FRAGMENTED = ("workload.placement=fragmented", "topology.mem_layout=layer_first")
MEASURED_TP2 = [
    (("workload.num_tokens=16384", *DMA), "rotating", 11.28),
    (("workload.num_tokens=65536", *DMA), "rotating", 44.22),
    (("workload.num_tokens=16384", *FRAGMENTED), "rotating", 18.92),
    (("workload.num_tokens=65536", *FRAGMENTED), "rotating", 69.19),
]


@pytest.mark.parametrize(("overrides", "fastest", "ms"), MEASURED_TP2)
def test_auto_picks_what_was_measured_fastest_at_tp2_within_a_quarter(
    overrides: tuple[str, ...], fastest: str, ms: float
) -> None:
    job = job_config(*H200_TP2, *overrides, "workload.device_tokens=131072", "strategy=auto")
    assert job.strategy.config.name == fastest
    assert any(n.startswith(f"strategy=auto picked {fastest}") for n in job.verdict.notes)
    estimated = plan_estimate(job, links_of("h200"))["load"]["ms"]
    assert abs(estimated - ms) / ms < 0.25, (estimated, ms)


def test_auto_runs_replicated_where_it_alone_is_active_or_dedup_would_lose() -> None:
    alone = job_config("model=deepseek_v3", "topology=tp1", "strategy=auto")
    assert alone.strategy.config.name == "replicated"
    assert "the only active strategy" in alone.verdict.notes[-1]
    across = job_config(
        "model=deepseek_v3", "topology=two_nodes_tp16", "workload.num_tokens=16384",
        "workload.device_tokens=65536", "strategy=auto",
    )  # fmt: skip
    assert across.strategy.config.name == "replicated"  # single_source broadcasts between nodes
    cpu = job_config("topology=tp2", "runtime.links=cpu", "strategy=auto")
    assert cpu.strategy.config.name in {"replicated", "rotating", "single_source"}


def test_a_job_whose_dedup_strategy_is_expected_to_lose_carries_the_warning_in_its_notes() -> None:
    losing = job_config(
        "model=deepseek_v3", "topology=two_nodes_tp16", "strategy=single_source",
        "workload.num_tokens=16384", "workload.device_tokens=65536",
    )  # fmt: skip
    (warning,) = [n for n in losing.verdict.notes if n.startswith("WARN")]
    assert warning.startswith("WARN dedup_expected_to_win: single_source is expected to lose")
    winning = job_config("model=deepseek_v3", "topology=tp2", "strategy=rotating")
    assert not any(n.startswith("WARN") for n in winning.verdict.notes)
