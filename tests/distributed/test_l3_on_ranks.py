"""The L3 tier on real gloo ranks, with a file store and a real Mooncake Store (a master on
loopback that the tests start and stop): bit-exact load-backs from L3 for every strategy, the
bytes each rank writes and reads, plan consensus and its fallback, and damaged objects."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import l3fns
import pytest
import rankfns
from conftest import MOONCAKE, job_config

from pipeline.config.job import Job
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.jobs.l3_store import master_on_loopback
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

STRATEGIES = ("replicated", "single_source", "rotating")
SMALL = ("workload.num_tokens=32", "workload.device_tokens=128", "workload.cycles=2")


def store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> StorageConfig:
    """A folder, or the module's master (started only for a test that asks for it)."""
    if kind == "file":
        return StorageConfig(kind=StorageKind.file, path=str(tmp_path))
    return request.getfixturevalue("mooncake")


def with_store(job: Job, storage: StorageConfig) -> Job:
    return dataclasses.replace(job, storage=storage)


def check_l3_bytes(job: Job, reports: list[dict], group: list[int]) -> None:
    """Writes go once per replica group; replicated reads on every rank, single_source on the
    first rank alone, rotating on each owner (its share)."""
    workload = job.workload
    total = workload.num_tokens * workload.cycles * job.model.bytes_per_token
    mine = [reports[r] for r in group]
    # one object per page, whoever wrote it: the group's first rank writes every byte
    assert [r["l3_write_bytes"] for r in mine] == [total] + [0] * (len(group) - 1)
    reads = [r["l3_read_bytes"] for r in mine]
    name = job.strategy.config.name
    if name == "replicated":
        assert reads == [total] * len(group)
    elif name == "single_source":
        assert reads == [total] + [0] * (len(group) - 1)
    else:
        assert sum(reads) == total and all(0 < r < total for r in reads)
        # an owner sent the writer what it reads back
        assert [r["l3_send_bytes"] for r in mine[1:]] == reads[1:]
    pages = workload.num_tokens * workload.cycles // job.model.page_size
    assert all(r["l3_hit_pages"] == pages and r["l3_fallbacks"] == 0 for r in mine)


@pytest.mark.parametrize("kind", ["file", MOONCAKE])
@pytest.mark.parametrize(
    ("topology", "tp", "model", "groups"),
    [
        ("topology=tp2", 2, "tiny_dsa", [[0, 1]]),
        # both host layouts: a unit's page is contiguous (layer_first) or strided (page_first)
        ("topology=tp4 topology.mem_layout=layer_first", 4, "tiny_mla", [[0, 1, 2, 3]]),
        ("topology=tp4_dp2", 4, "tiny_dsa", [[0, 1], [2, 3]]),
    ],
)
def test_run_loads_back_from_l3_bit_exact(
    kind: str,
    topology: str,
    tp: int,
    model: str,
    groups: list[list[int]],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    storage = store(kind, tmp_path, request)
    jobs = [
        with_store(
            job_config(
                f"strategy={s}",
                f"model={model}",
                *topology.split(),
                f"storage={kind}",
                f"workload.seed={i + 10 * tp}",  # new prefixes per job: nothing stored yet
                *SMALL,
            ),
            storage,
        )
        for i, s in enumerate(STRATEGIES)
    ]
    ranks = launch(rankfns.run_jobs, jobs, tp, backend="gloo", timeout_s=120)
    assert ranks is not None
    for i, job in enumerate(jobs):
        reports = [ranks[r][i] for r in range(tp)]
        assert all(r["verified"] for r in reports), [r["mismatch"] for r in reports]
        assert job.strategy.config.name == STRATEGIES[i]
        for group in groups:
            check_l3_bytes(job, reports, group)


@pytest.mark.parametrize("kind", ["file", MOONCAKE])
@pytest.mark.parametrize("strategy", ["single_source", "rotating"])
def test_ranks_that_plan_differently_fall_back_to_their_own_reads(
    kind: str, strategy: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Negative control: rank 1 plans other device pages. Every rank sees the SHA-256s differ,
    reads every object itself into its own pages, and the result is still bit-exact."""
    job = job_config(f"strategy={strategy}", "model=tiny_dsa", "topology=tp2", f"storage={kind}")
    storage = store(kind, tmp_path, request)
    payload = (with_store(job, storage), "plan_differs")
    reports = launch(l3fns.through_l3, payload, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    page_bytes = 4 * job.model.bytes_per_token * job.model.page_size
    for r in reports:
        assert (r["found"], r["hits"], r["fallback"], r["loaded"]) == (4, 4, True, "")
        assert r["fallback_ops"] == 1 and r["l3_read_bytes"] == page_bytes  # each read all


@pytest.mark.parametrize(
    ("kind", "case", "hits"),
    [
        ("file", "none", 4),
        ("file", "missing", 2),
        ("file", "truncated", 1),
        ("file", "corrupted", 2),
        ("file", "corrupted_first", 1),
        ("file", "header", 1),
        ("file", "foreign", 0),
        pytest.param("mooncake", "truncated", 1, marks=pytest.mark.mooncake),
        pytest.param("mooncake", "corrupted", 2, marks=pytest.mark.mooncake),
    ],
)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_bad_object_is_a_miss_from_its_page_on_never_wrong_bytes(
    kind: str, case: str, hits: int, strategy: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """(tp2's page_first host pool: every read goes through staging)"""
    job = job_config(f"strategy={strategy}", "model=tiny_dsa", "topology=tp2", f"storage={kind}")
    payload = (with_store(job, store(kind, tmp_path, request)), case)
    reports = launch(l3fns.through_l3, payload, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    for r in reports:
        assert r["hits"] == hits and not r["fallback"]
        assert r["found"] == (hits if case == "missing" else 4)  # lookup sees only presence
        assert r["loaded"] == "" and r["rest_untouched"] and r["device_tier_kept"] == ""


@pytest.mark.parametrize("case", ["corrupted", "corrupted_first", "header", "truncated"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    "layout",
    [
        ("topology.mem_layout=layer_first",),
        ("topology.mem_layout=page_first_direct", "topology.io_backend=direct"),
    ],
)
def test_a_bad_object_read_straight_into_pool_pages_is_a_miss_never_loaded(
    layout: tuple[str, ...], strategy: str, case: str, tmp_path: Path
) -> None:
    """Host layouts whose pages the store reads straight into: a damaged object leaves some of
    its bytes in the host page, which is then never loaded, nor any page after it."""
    job = job_config(
        f"strategy={strategy}", "model=tiny_dsa", "topology=tp2", "storage=file", *layout
    )
    payload = (with_store(job, StorageConfig(kind=StorageKind.file, path=str(tmp_path))), case)
    reports = launch(l3fns.through_l3, payload, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    hits = {"corrupted": 2, "corrupted_first": 1, "header": 1, "truncated": 1}[case]
    for r in reports:
        assert (r["hits"], r["found"], r["fallback"]) == (hits, 4, False)
        assert r["loaded"] == "" and r["rest_untouched"] and r["device_tier_kept"] == ""


@pytest.mark.parametrize(("chunk_pages", "windows"), [(0, 1), (1, 4), (3, 2)])
@pytest.mark.parametrize("strategy", ["replicated", "rotating"])
def test_a_load_from_l3_is_loaded_in_the_windows_it_claims(
    chunk_pages: int, windows: int, strategy: str, tmp_path: Path
) -> None:
    """storage.load_chunk_pages=0 is one window (read everything, then load); n > 0 loads 4
    pages in ceil(4 / n) windows: the bench's sides with and without windows are what they
    say. Every window bit-exact, agreed on in one round of the replica group."""
    job = job_config(f"strategy={strategy}", "model=tiny_dsa", "topology=tp2", "storage=file")
    storage = StorageConfig(kind=StorageKind.file, path=str(tmp_path), load_chunk_pages=chunk_pages)
    payload = (with_store(job, storage), "none")
    reports = launch(l3fns.through_l3, payload, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    for r in reports:
        assert (r["hits"], r["windows"], r["loaded"]) == (4, windows, "")
        # a round a window (none held only to learn every rank is done), after rotating's
        # agreement on its plan (`AgreeOnPlan`)
        assert r["rounds"] == windows + (strategy == "rotating")


def test_l3_calls_that_would_lose_data_are_refused_before_any_byte_moves(
    tmp_path: Path,
) -> None:
    job = job_config("strategy=rotating", "model=tiny_dsa", "topology=tp2", "storage=file")
    storage = StorageConfig(kind=StorageKind.file, path=str(tmp_path))
    reports = launch(
        l3fns.held_pages_refused, with_store(job, storage), 2, backend="gloo", timeout_s=120
    )
    assert reports is not None
    for errors in reports:
        assert "hold data" in errors[0] and "hold no data" in errors[1]
        assert "not page keys" in errors[2] and "not page keys" in errors[3]
        assert len(errors) == 4  # and the host pool is unchanged
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.mooncake
def test_a_master_that_dies_during_a_run_is_a_miss_and_loses_nothing() -> None:
    """(rotating: rank 1 sends its layers to rank 0, the writer, whose write is refused)"""
    job = job_config("strategy=rotating", "model=tiny_dsa", "topology=tp2", "storage=mooncake")
    with master_on_loopback() as (master, metadata):
        storage = StorageConfig(kind=StorageKind.mooncake, master=master, metadata_server=metadata)
        port = int(master.rpartition(":")[2])
        payload = (with_store(job, storage), port)
        reports = launch(l3fns.master_gone, payload, 2, backend="gloo", timeout_s=120)
    assert reports is not None
    for r in reports:
        assert (r["found"], r["hits"]) == (0, 0)
        assert r["device_kept"] == "" and r["host_kept"] == ""  # the host tier still loads
    assert "Mooncake put" in reports[0]["write_error"]
    assert reports[1]["write_error"] == ""  # its part, the send, completed
