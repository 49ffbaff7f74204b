"""The L3 tier's parts on their own: keys, object names and their format, who writes and reads
which object, the file store, the stage-order check, the store rule and the job's store."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
from pathlib import Path

import numpy as np
import pytest
from hydra import initialize_config_module

from pipeline.config.assemble import fetch_problems
from pipeline.config.compose import Session
from pipeline.config.eligibility import RULES
from pipeline.config.sources import SHIPPED
from pipeline.core.checks import ConfigError
from pipeline.core.crc_runs import CrcRuns
from pipeline.core.l3 import (
    Checks,
    PageObject,
    check_keys,
    digest,
    header,
    namespace,
    page_roles,
    prefix_keys,
    share_of,
    unit_digests,
)
from pipeline.core.model import IndexerConfig, KvDtype, ModelGeometry, ModelKind
from pipeline.core.ownership import Ownership, owner_map
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import POOL_LAYOUTS, MemLayout, Topology
from pipeline.engine.l3.pages import PageMap, Placement
from pipeline.engine.l3.stores import FileStore, MooncakeStore, PartRead, open_store
from pipeline.engine.l3.stores.beneath import Beneath, store_name, store_names
from pipeline.engine.transfer.pools import HostPool
from pipeline.jobs import l3_store
from pipeline.jobs.bench.l3 import kinds, l3_cases, with_stores
from pipeline.jobs.l3_store import check_direct_io, concrete, master_on_loopback

DSA = ModelGeometry(
    name="dsa",
    kind=ModelKind.mla,
    num_layers=5,
    kv_row_bytes=32,
    kv_dtype=KvDtype.bf16,
    page_size=4,
    indexer=IndexerConfig(row_bytes=8, layers=[0, 2, 4]),
)
SPACE = namespace(DSA)
OWN_NAME = PageObject("", DSA.units).name(SPACE, "ab" * 16)
"""An object's name: a file store removes only what lies there and names itself so."""
OWN = header(SPACE, OWN_NAME, [0] * len(DSA.units), [u.page_bytes for u in DSA.units], Checks())
READ, HITS, PLAN = (
    {"_target_": "stages.read_objects.ReadObjects"},
    {"_target_": "stages.agree_on_hits.AgreeOnHits"},
    {"_target_": "stages.agree_on_plan.AgreeOnPlan"},
)


def test_a_key_names_the_whole_prefix_up_to_its_page() -> None:
    tokens = list(range(16))
    keys = prefix_keys(tokens, 4, SPACE)
    assert len(keys) == 4 and len(set(keys)) == 4
    assert prefix_keys(tokens[:8], 4, SPACE) == keys[:2]  # a prefix keeps its keys
    changed = prefix_keys([*tokens[:5], 99, *tokens[6:]], 4, SPACE)
    assert changed[0] == keys[0] and all(a != b for a, b in zip(changed[1:], keys[1:], strict=True))
    check_keys(keys, 4)
    with pytest.raises(ValueError, match="whole pages"):
        prefix_keys(tokens[:6], 4, SPACE)


def test_incompatible_caches_never_share_a_key() -> None:
    others = [
        dataclasses.replace(DSA, kv_dtype=KvDtype.fp8),
        dataclasses.replace(DSA, page_size=8),
        dataclasses.replace(DSA, kv_row_bytes=64),
        dataclasses.replace(DSA, indexer=None),
        dataclasses.replace(DSA, name="other"),
    ]
    spaces = {namespace(m) for m in [DSA, *others]}
    assert len(spaces) == 6
    tokens = list(range(8))
    assert len({prefix_keys(tokens, 4, s)[0] for s in spaces}) == 6


@pytest.mark.parametrize("bad", ["../../etc/passwd", "ABCDEF" * 6, "0" * 31, 7])
def test_keys_that_could_name_other_files_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="not page keys"):
        check_keys(["0" * 32, bad], 2)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="one key per page"):
        check_keys(["0" * 32], 2)


@pytest.mark.parametrize("checks", [Checks(), Checks(b"k" * 32)], ids=["crc32c", "keyed"])
def test_a_header_is_trusted_only_when_it_is_exactly_the_one_asked_for(checks: Checks) -> None:
    obj = PageObject("", DSA.units)
    name = obj.name(SPACE, "0" * 32)
    digests = list(range(1, len(DSA.units) + 1))
    lengths = [u.page_bytes for u in DSA.units]
    head = header(SPACE, name, digests, lengths, checks)
    assert len(head) == obj.header_size(SPACE, name, checks)
    assert unit_digests(head, obj, SPACE, name, checks) == digests
    for i in range(len(head)):  # any flipped bit, in a field, the name or the table
        bad = bytearray(head)
        bad[i] ^= 0x10
        assert unit_digests(bad, obj, SPACE, name, checks) is None, i
    assert unit_digests(head[:-1], obj, SPACE, name, checks) is None  # truncated
    assert unit_digests(head, obj, SPACE, obj.name(SPACE, "1" * 32), checks) is None  # another's
    other = namespace(dataclasses.replace(DSA, page_size=8))
    assert unit_digests(head, obj, other, name, checks) is None
    longer = header(SPACE, name, digests, [*lengths[:-1], lengths[-1] + 1], checks)
    assert unit_digests(longer, obj, SPACE, name, checks) is None  # another length
    other_key = header(SPACE, name, digests, lengths, Checks(b"o" * 32))
    assert checks.key is None or unit_digests(other_key, obj, SPACE, name, checks) is None
    assert digest(b"a" * 100) != digest(b"a" * 99 + b"b")


def test_a_keyed_store_trusts_only_objects_made_with_its_key() -> None:
    """S4: CRC-32C is public, so anyone can make an object that passes it; with a key, an
    object checked without it, or with another key, is a miss."""
    obj = PageObject("", DSA.units)
    name = obj.name(SPACE, "0" * 32)
    mine, theirs, plain = Checks(b"m" * 32), Checks(b"t" * 32), Checks()
    payload = [b"x" * u.page_bytes for u in DSA.units]
    for made in (theirs, plain):
        lengths = [u.page_bytes for u in DSA.units]
        forged = header(SPACE, name, [made.unit()(p) for p in payload], lengths, made)
        assert unit_digests(forged, obj, SPACE, name, mine) is None
    lengths = [u.page_bytes for u in DSA.units]
    good = header(SPACE, name, [mine.unit()(p) for p in payload], lengths, mine)
    table = unit_digests(good, obj, SPACE, name, mine)
    assert table is not None and table[0] == mine.unit()(payload[0]) != plain.unit()(payload[0])
    assert unit_digests(good, obj, SPACE, name, plain) is None  # no key: not readable either


def test_one_object_per_page_whoever_writes_it_and_who_reads_which_units() -> None:
    group, units = (4, 5, 6), DSA.units
    for ownership in Ownership:
        roles = [page_roles(owner_map(ownership, group, units), units, r) for r in group]
        assert {r.writer for r in roles} == {4}
    rep = owner_map(Ownership.replicated, group, units)
    assert [page_roles(rep, units, r).reads for r in group] == [units] * 3
    assert page_roles(rep, units, 4).senders == ()
    single = owner_map(Ownership.single_source, group, units)
    assert [page_roles(single, units, r).reads for r in group] == [units, (), ()]
    owners = owner_map(Ownership.rotating, group, units)
    reads = [page_roles(owners, units, r).reads for r in group]
    assert reads == [owners.owned(r, units) for r in group]
    assert sorted(u.ordinal for r in reads for u in r) == [u.ordinal for u in units]
    assert page_roles(owners, units, 5).senders == (5, 6)  # they send the writer their layers
    obj = PageObject("-s1of2", units)
    assert obj.name(SPACE, "ab" + "0" * 30) == f"{SPACE}/ab/ab{'0' * 30}-s1of2"
    assert list(obj.offsets.values()) == [
        sum(u.page_bytes for u in units[:i]) for i in range(len(units))
    ]


def test_a_share_names_which_bytes_of_the_attention_group_an_object_holds() -> None:
    mla, mha = DSA, dataclasses.replace(DSA, kind=ModelKind.mha, indexer=None)
    assert share_of(Topology(name="t", tp_size=4), mla, 3) == ""
    dcp = Topology(name="t", tp_size=8, dcp_size=4)
    assert [share_of(dcp, mla, r) for r in (0, 1, 5)] == ["-s0of4", "-s1of4", "-s1of4"]
    assert [share_of(Topology(name="t", tp_size=2), mha, r) for r in (0, 1)] == [
        "-s0of2",
        "-s1of2",
    ]


def test_the_file_store_writes_whole_objects_or_none(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    assert store.get("ns/ab/key") is None
    store.put("ns/ab/key", [b"first"])
    store.put("ns/ab/key", [b"sec", memoryview(b"ond")])
    assert store.get("ns/ab/key") == b"second"
    assert store.exists(["ns/ab/key", "ns/ab/other"]) == [True, False]
    assert [p.name for p in (tmp_path / "ns/ab").iterdir()] == ["key"]  # no temp files


def test_the_file_store_reads_ranges_only_of_an_object_of_its_length(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    parts = [memoryview(bytes([i % 256]) * 100) for i in range(1500)]  # more than one preadv
    store.put("big", parts)
    into = [memoryview(bytearray(100)) for _ in range(1500)]
    assert store.read("big", 150_000, [(0, into)])
    assert [bytes(v) for v in into] == [bytes(v) for v in parts]
    some = [memoryview(bytearray(100)) for _ in range(3)]
    assert store.read("big", 150_000, [(700, some[:1]), (100_000, some[1:])])
    assert [bytes(v) for v in some] == [bytes([7]) * 100, bytes([232]) * 100, bytes([233]) * 100]
    assert not store.read("big", 149_999, [(0, into)])  # the object is longer
    assert not store.read("absent", 150_000, [(0, into)])


@pytest.mark.parametrize(
    "kind", [StorageKind.file, pytest.param(StorageKind.mooncake, marks=pytest.mark.mooncake)]
)
def test_each_store_writes_parts_reads_ranges_and_removes(kind: StorageKind) -> None:
    """The same contract on both stores; Mooncake's master runs on loopback for the test."""
    with concrete(StorageConfig(kind=kind, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, 1 << 20)
        try:
            named = OWN[:4096] + bytes(4096 - len(OWN[:4096]))  # a header naming it: the
            parts = [memoryview(named), *(memoryview(bytes([i]) * 4096) for i in range(1, 40))]
            store.put(OWN_NAME, parts)  # file store removes only what proves to be its own
            into = [memoryview(bytearray(4096)) for _ in range(40)]
            assert store.read(OWN_NAME, 40 * 4096, [(0, into)])
            assert b"".join(into) == b"".join(parts) == store.get(OWN_NAME)
            ranged = [memoryview(bytearray(4096)) for _ in range(2)]
            assert store.read(
                OWN_NAME, 40 * 4096, [(4096 * 3, ranged[:1]), (4096 * 39, ranged[1:])]
            )
            assert [bytes(v)[0] for v in ranged] == [3, 39]
            assert not store.read(OWN_NAME, 39 * 4096, [(0, into[1:])])  # another length
            assert (
                not store.read("ns/ab/none", 40 * 4096, [(0, into)])
                and store.get("ns/ab/none") is None
            )
            store.remove([OWN_NAME, "ns/ab/none"])  # just read, and absent: both fine
            assert store.exists([OWN_NAME]) == [False]
        finally:
            store.close()


def test_a_fetch_must_agree_on_hits_and_dedup_on_its_plan() -> None:
    assert fetch_problems([PLAN, READ, HITS], Ownership.rotating) == []
    assert fetch_problems([READ, HITS], Ownership.replicated) == []
    assert fetch_problems([], Ownership.single_source) == []  # reads nothing, loads nothing
    (missing_plan,) = fetch_problems([READ, HITS], Ownership.single_source)
    assert "AgreeOnPlan must come before" in missing_plan.message
    (hits_first,) = fetch_problems([HITS, READ], Ownership.replicated)
    assert missing_plan.key == "strategy.l3.fetch" and "AgreeOnHits must come after" in (
        hits_first.message
    )


def test_a_strategy_whose_fetch_cannot_agree_is_refused_before_a_rank_starts() -> None:
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        session = Session.compose(
            [
                "strategy=single_source",
                "storage=file",
                "strategy.l3.fetch=[{_target_: stages.read_objects.ReadObjects}]",
            ]
        )
        with pytest.raises(ConfigError) as e:
            session.job()
    assert {p.key for p in e.value.problems} == {"strategy.l3.fetch"}


def test_a_file_store_on_several_nodes_leaves_replicated_readers_without_objects() -> None:
    rule = RULES["readers_reach_store"]
    one, two = Topology(name="t", tp_size=2), Topology(name="t", tp_size=4, nnodes=2)
    file, mooncake = StorageConfig(kind=StorageKind.file), StorageConfig(kind=StorageKind.mooncake)
    assert rule(one, DSA, file)[0] and rule(two, DSA, mooncake)[0]
    passed, message = rule(two, DSA, file)
    assert not passed and "storage=mooncake" in message


def test_a_job_without_a_folder_gets_a_temporary_one_removed_after() -> None:
    with concrete(StorageConfig(kind=StorageKind.file)) as storage:
        assert storage.path is not None and Path(storage.path).is_dir()
        (Path(storage.path) / "object").write_bytes(b"x")
    assert not Path(storage.path).exists()
    given = StorageConfig(kind=StorageKind.none)
    with concrete(given) as same:
        assert same == given


def test_a_master_that_does_not_answer_is_an_error_before_any_rank_starts() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    storage = StorageConfig(
        kind=StorageKind.mooncake,
        master=f"127.0.0.1:{port}",
        metadata_server="http://127.0.0.1:1/metadata",
    )
    with pytest.raises(ConfigError) as e, concrete(storage):
        pass
    assert e.value.problems[0].key == "storage.master"


def test_under_torchrun_a_store_must_be_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in dict(
        RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="h", MASTER_PORT="1"
    ).items():
        monkeypatch.setenv(name, value)
    for storage, key in (
        (StorageConfig(kind=StorageKind.file), "storage.path"),
        (StorageConfig(kind=StorageKind.mooncake), "storage.master"),
    ):
        with pytest.raises(ConfigError) as e, concrete(storage):
            pass
        assert e.value.problems[0].key == key


def test_each_l3_bench_case_keeps_its_own_segment_on_the_store_made_for_the_run() -> None:
    """A segment sized for the smallest case made Mooncake evict the larger case's first
    pages (every later load missed): each case keeps its size, on the shared master."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        session = Session.compose(["bench=l3", "model=deepseek_v3", "topology=tp2"])
        cases = l3_cases(session)
    made = {
        "file": StorageConfig(kind=StorageKind.file, path="/tmp/x"),
        "mooncake": StorageConfig(
            kind=StorageKind.mooncake, master="127.0.0.1:1", metadata_server="http://h:1/m"
        ),
    }
    assert [kind for kind, _ in kinds(cases)] == ["file", "mooncake"]
    placed = with_stores(cases, made)
    for (job, case), (placed_job, placed_case) in zip(cases, placed, strict=True):
        assert placed_case == case
        assert placed_job.storage.segment_bytes == job.storage.segment_bytes
        assert placed_job.storage.master == made[case["store"]].master
    sizes = {c["tokens"]: j.storage.segment_bytes for j, c in placed if c["store"] == "mooncake"}
    assert sizes[65536] >= 65536 * 70272 // 2 > sizes[16384] >= 16384 * 70272 // 2  # per rank


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("storage.io_threads=0", "storage.io_threads"),
        ("storage.io_threads=65", "storage.io_threads=65: at most 64"),
        ("storage.segment_bytes=1024", "storage.segment_bytes"),
        ("storage.master=not a host", "storage.master"),
    ],
)
def test_store_knobs_out_of_range_are_refused_naming_the_key(override: str, message: str) -> None:
    with (
        initialize_config_module(config_module=SHIPPED, version_base="1.3"),
        pytest.raises(ConfigError, match=re.escape(message)),
    ):
        Session.compose(["storage=mooncake", override]).job()


@pytest.mark.parametrize("one_call", [True, False])
def test_the_file_store_never_follows_a_link_nor_reads_what_is_not_a_regular_file(
    tmp_path: Path, one_call: bool
) -> None:
    """Both ways of opening below the store's folder: openat2 resolving beneath it with no
    link (one call), and the walk of openat calls with O_NOFOLLOW where a kernel lacks it."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "key").write_bytes(b"theirs")
    store = FileStore(str(root))
    if one_call and not store.beneath.one_call:
        pytest.skip("this kernel (or its sandbox) has no openat2")
    store.beneath.one_call = one_call
    (root / "ns").symlink_to(outside)  # a planted folder link
    with pytest.raises(OSError):
        store.put("ns/key", [b"mine"])
    assert store.get("ns/key") is None and store.exists(["ns/key"]) == [False]
    assert not store.read("ns/key", 6, [(0, [memoryview(bytearray(6))])])
    store.remove(["ns/key"])
    assert (outside / "key").read_bytes() == b"theirs"  # untouched through the link
    (root / "ns").unlink()
    (root / "ns").mkdir()
    (root / "ns" / "link").symlink_to(outside / "key")  # a planted file link
    assert store.get("ns/link") is None and store.exists(["ns/link"]) == [False]
    os.mkfifo(root / "ns" / "fifo")  # an open() that would block forever
    assert not store.read("ns/fifo", 6, [(0, [memoryview(bytearray(6))])])
    assert store.exists(["ns/fifo"]) == [False]
    with pytest.raises(ValueError, match="not a store name"):
        store.put("../outside/key", [b"x"])
    (root / "ns" / "deep").symlink_to(outside)  # a link in the middle of a walk
    (outside / "ab").mkdir()
    with pytest.raises(OSError):
        store.put("ns/deep/ab/key", [b"mine"])
    assert store.get("ns/deep/ab/x") is None and not (outside / "ab" / "key").exists()
    store.put("ns/ab/key", [b"mine"])  # and a real folder still works
    assert store.get("ns/ab/key") == b"mine"
    store.close()


NAMES = ["ns/ab/key", "key", "a.b/c-d_e", "ü/key", "..", "ns/../key", "ns//key", "/key"]
NAMES += ["ns/", ".hidden", "ns/.key", "ns/key\nkey", "", "a b", "\n", "key\n"]


@pytest.mark.parametrize("name", NAMES)
def test_a_load_s_names_are_checked_together_as_each_alone(tmp_path: Path, name: str) -> None:
    """A load's names are checked in one match where all are plain (`store_names`): a name
    that is not one, among others, is opened by none, and one holding a newline is not taken
    for two; the file store opens only the plain ones of the batch."""
    mixed = ["ns/ab/key", name, "key"]
    assert store_names(mixed) == [n if store_name(n) else "" for n in mixed]
    assert store_names([name]) == [name if store_name(name) else ""]
    assert store_name(name) == (name in NAMES[:4])
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "key").write_bytes(b"theirs")
    (tmp_path / "store" / "ns" / "ab").mkdir(parents=True)
    for there in ("ns/ab/key", "key", "ns/key"):
        (tmp_path / "store" / there).write_bytes(b"x")
    store = FileStore(str(tmp_path / "store"))
    try:
        assert store.exists(mixed) == [True, name in ("ns/ab/key", "key"), True]
        assert store.exists(["../outside/key", "key"]) == [False, True]
    finally:
        store.close()


def test_objects_of_the_first_form_are_never_found_by_the_current_one() -> None:
    """Format 1 named one object per writer under a 'v1-' namespace; format 3's names live
    under 'v3-', so a store holding both serves each form to its own readers only."""
    key = "ab" * 16
    current = PageObject("", DSA.units).name(SPACE, key)
    assert SPACE.startswith("v3-") and current.startswith(SPACE + "/")
    first = SPACE.replace("v3-", "v1-", 1)
    assert all(not current.startswith(first) for first in (f"{first}/ab/{key}/all", f"{first}/"))


@pytest.mark.parametrize("registered", [True, False])
@pytest.mark.parametrize(
    "kind", [StorageKind.file, pytest.param(StorageKind.mooncake, marks=pytest.mark.mooncake)]
)
def test_read_parts_reads_ranges_of_many_objects_up_to_the_first_miss(
    kind: StorageKind, registered: bool
) -> None:
    """A parts reader's call reads ranges of several objects in order (Mooncake: one ranged
    get where all land in registered memory, else one read at a time); it counts the leading
    reads that found their object and passed their checks, and stops at an absent one or a
    failed check. Two Mooncake readers of one object both read it (a get session is per
    key); the file store's reader reads an object replaced after its first read as it was,
    until it is closed."""
    with concrete(StorageConfig(kind=kind, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, 1 << 20)
        try:
            for k in range(4):
                store.put(f"ns/ab/k{k}", [memoryview(bytes([k * 10 + i]) * 4096) for i in range(8)])
            pool = np.zeros(8 * 4096, dtype=np.uint8)
            if registered:
                store.register([pool.data])
            views = [pool.data[i * 4096 : (i + 1) * 4096] for i in range(8)]
            seen: list[tuple[int, int]] = []

            def part(k: int, name: str = "", ok: bool = True) -> PartRead:
                ranges = [
                    (4096 * 3, views[2 * k : 2 * k + 1]),
                    (4096 * 6, views[2 * k + 1 : 2 * k + 2]),
                ]
                return name or f"ns/ab/k{k}", 8 * 4096, ranges, lambda i: seen.append((k, i)) or ok

            reader = store.parts_reader()
            assert reader.read_parts([part(k) for k in range(4)]) == 4
            assert [int(pool[i * 4096]) for i in range(8)] == [3, 6, 13, 16, 23, 26, 33, 36]
            assert seen == [(k, i) for k in range(4) for i in range(2)]
            assert reader.read_parts([part(0), part(1, "ns/ab/none"), part(2)]) == 1
            assert reader.read_parts([part(0), part(1), part(2, ok=False), part(3)]) == 2
            assert reader.read_parts([]) == 0
            if kind is StorageKind.mooncake and registered:  # two readers of one object
                other = store.parts_reader()
                assert other.read_parts([part(1)]) == 1
                other.close()  # may end the session of k1 for both
                assert reader.read_parts([part(1), part(2)]) == 2
            if kind is StorageKind.file:
                store.put("ns/ab/k0", [memoryview(bytes([99]) * 4096) for _ in range(8)])
                assert reader.read_parts([part(0)]) == 1 and int(pool[0]) == 3  # as opened
                reader.close()
                reader = store.parts_reader()
                assert reader.read_parts([part(0)]) == 1 and int(pool[0]) == 99
            reader.close()
            if registered:
                store.unregister([pool.data])
        finally:
            store.close()


@pytest.mark.mooncake
def test_mooncake_reads_land_in_registered_memory_without_a_copy_gaps_and_all() -> None:
    """Buffers in registered memory get the object scattered straight into them (the bytes
    no range asked for go to a scratch region); the same reads into unregistered memory go
    through a staging buffer. Both give the same bytes."""
    with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, 1 << 20)
        try:
            assert isinstance(store, MooncakeStore)
            parts = [memoryview(bytes([i]) * 4096) for i in range(40)]
            store.put("ns/ab/key", parts)
            pool = np.zeros(8 * 4096, dtype=np.uint8)
            store.register([pool.data])
            views = [pool.data[i * 4096 : (i + 1) * 4096] for i in range(3)]
            ranges = [(4096 * 2, views[:1]), (4096 * 7, views[1:])]  # units 2, then 7 and 8
            assert (
                store.regions.scatter(40 * 4096, ranges) is not None
            )  # lands straight in the pool
            seen: list[int] = []
            assert store.read("ns/ab/key", 40 * 4096, ranges, lambda i: not seen.append(i))
            assert [int(pool[i * 4096]) for i in range(3)] == [2, 7, 8] and seen == [0, 1]
            assert not store.read("ns/ab/key", 40 * 4096, ranges, lambda i: i == 0)  # a check
            loose = [memoryview(bytearray(4096))]
            assert store.regions.scatter(40 * 4096, [(4096 * 5, loose)]) is None  # not registered
            assert store.read("ns/ab/key", 40 * 4096, [(4096 * 5, loose)])
            assert bytes(loose[0]) == bytes([5]) * 4096
            store.unregister([pool.data])
            assert store.regions.scatter(40 * 4096, ranges) is None
        finally:
            store.close()


@pytest.mark.parametrize(
    "tokens", [[1.5, 2.0, 3.0, 4.0], [2**64, 1, 2, 3], ["a", "b", "c", "d"], [[1, 2], [3, 4]]]
)
def test_only_integer_token_ids_make_keys(tokens: list) -> None:
    with pytest.raises(ValueError, match="tokens: "):
        prefix_keys(tokens, 4, SPACE)


def test_a_key_may_name_one_page_only() -> None:
    keys = prefix_keys(list(range(8)), 4, SPACE)
    with pytest.raises(ValueError, match="keys repeat"):
        check_keys([keys[0], keys[0]], 2)


def listening(pid: int) -> list[str]:
    """The local addresses a process listens on (TCP, from /proc: no tool needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1].rpartition(":")[0])
    return found


@pytest.mark.mooncake
def test_the_master_a_job_starts_listens_on_loopback_only() -> None:
    """S3: its RPC and metrics ports on 127.0.0.1, and no HTTP metadata server at all (it
    listened on every address whatever its host flag said; clients handshake directly)."""
    with master_on_loopback() as (master, metadata):
        assert metadata == "P2PHANDSHAKE" and master.startswith("127.0.0.1:")
        (pid,) = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and f"rpc_port={master.rpartition(':')[2]}" in _cmdline(p)
        ]
        addresses = listening(pid)
        assert addresses and all(
            a in ("0100007F", "00000000000000000000000001000000") for a in addresses
        )


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_direct_io_store_reads_around_the_page_cache_and_a_buffered_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's O_DIRECT and buffered sides are what they say: only the first opens with
    O_DIRECT and reads through the aligned buffers; both give the object's bytes."""
    storage = StorageConfig(kind=StorageKind.file, path=str(tmp_path), direct_io=True)
    try:
        check_direct_io(storage, str(tmp_path))
    except ConfigError:
        pytest.skip("this folder's file system refuses O_DIRECT (tmpfs)")
    opened: list[int] = []
    real_open = Beneath.open  # every open below a store's folder
    monkeypatch.setattr(
        Beneath,
        "open",
        lambda self, parts, flags, *a: opened.append(flags) or real_open(self, parts, flags, *a),
    )
    parts = [memoryview(bytes([i]) * 4096) for i in range(3)]
    for direct in (True, False):
        store = open_store(dataclasses.replace(storage, direct_io=direct), 1 << 20)
        store.put(f"ns/ab/{direct}", parts)
        opened.clear()
        into = [memoryview(bytearray(4096)) for _ in range(2)]
        assert store.read(f"ns/ab/{direct}", 3 * 4096, [(4096, into)])
        assert [bytes(v)[0] for v in into] == [1, 2]
        assert any(f & os.O_DIRECT for f in opened) == direct
        assert (store.direct is not None) == direct  # type: ignore[attr-defined]


@pytest.mark.parametrize("sizes", [[1], [3, 5], [73728] * 61, [4096, 1, 73728, 7, 100]])
def test_a_run_of_units_is_checked_by_one_crc_that_their_own_crcs_combine_to(
    sizes: list[int],
) -> None:
    """A group read as one buffer is checked in one call (61 calls per object, each a turn
    of Python's lock, made 16 I/O threads slower than 4 on the H200 host): the combined CRC
    equals the CRC of the units end to end, and a flipped byte in any unit is caught."""
    rng = np.random.default_rng(len(sizes))
    units = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    crcs = [digest(u) for u in units]
    runs = CrcRuns()
    span = bytearray(b"".join(units))
    assert runs(crcs, sizes) == digest(bytes(span))
    assert runs.check(memoryview(span), crcs, sizes)
    for at in {0, len(span) // 2, len(span) - 1}:
        span[at] ^= 1
        assert not runs.check(memoryview(span), crcs, sizes)
        span[at] ^= 1


@pytest.mark.parametrize("layout", POOL_LAYOUTS)
@pytest.mark.parametrize("indexer", [False, True])
def test_a_page_is_read_as_one_span_only_where_its_units_lie_end_to_end(
    layout: MemLayout, indexer: bool
) -> None:
    """The one-CRC read (BENCHMARKS' H200 L3 rows, page_first_direct MLA) is taken exactly
    where a page's units are one run of host memory, and that span is their bytes; every
    other layout (and a DSA page, whose index units live apart) reads and checks unit by
    unit."""
    model = DSA if indexer else dataclasses.replace(DSA, indexer=None)
    obj = PageObject("", model.units)
    pool = HostPool.allocate(model, model.units, 4, layout, pin_memory=False)
    pages = PageMap(obj, model.units, Placement(obj, pool.views))
    spans = pages.spans(2)
    assert (spans is not None) == (layout is MemLayout.page_first_direct and not indexer)
    if spans is not None:
        (span,), views = spans, pages.views(2)
        start = np.frombuffer(span, np.uint8).ctypes.data
        assert start == np.frombuffer(views[0], np.uint8).ctypes.data
        assert span.nbytes == sum(v.nbytes for v in views) == obj.page_bytes


@pytest.mark.parametrize(("code", "hint"), [(3, False), (127, True)])
def test_a_master_that_exits_at_once_is_named_with_what_it_said(
    code: int, hint: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error says the master's exit code and the last lines of its stderr; the libibverbs1
    hint only where the loader could not start it (127)."""
    fake = tmp_path / "mooncake_master"
    said = "echo 'starting' >&2\necho 'bind failed: port taken' >&2"
    fake.write_text(f"#!/bin/sh\n{said}\nexit {code}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(l3_store, "master_binary", lambda: str(fake))
    with pytest.raises(RuntimeError) as failed, master_on_loopback():
        pass
    message = str(failed.value)
    assert f"exit code {code}" in message and "starting | bind failed: port taken" in message
    assert ("libibverbs1" in message) is hint
