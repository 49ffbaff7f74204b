"""SGLang's HiCache L3 through this project's stores: SGLang's own `StorageBackendFactory`
builds `pipeline.integrations.sglang.PipelineStorage` from the extra config, and its
`batch_set_v1` / `batch_exists` / `batch_get_v1` move host pages of each layout bit-exact
through the file store and Mooncake. The host pool is a stand-in of SGLang's buffer shapes
(`tests/sglangfns.py` says why, and which parts are SGLang's own code)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import MOONCAKE
from sglangfns import HostPool, MHATokenToKVPoolHost, built, host_pool, import_sglang, slots

import_sglang()


import pipeline  # noqa: E402
from pipeline.integrations.sglang import PipelineStorage  # noqa: E402
from pipeline.jobs.l3_store import master_on_loopback  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
KINDS = [pytest.param(True, id="mla"), pytest.param(False, id="mha")]
STORES = [pytest.param("file", id="file"), MOONCAKE]
HASHES = [f"{i:02x}" * 32 for i in range(1, 7)]
"""Six pages' SGLang hashes (hex SHA-256 strings, each naming its whole prefix)."""


@pytest.fixture(scope="module")
def master() -> Iterator[tuple[str, str]]:
    with master_on_loopback() as found:
        yield found


def store_config(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "file":
        return {"kind": "file", "path": str(tmp_path / "l3")}
    master, metadata = request.getfixturevalue("master")
    return {
        "kind": "mooncake",
        "master": master,
        "metadata_server": metadata,
        "segment_bytes": 32 << 20,
    }


def extra(storage: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The JSON of --hicache-storage-backend-extra-config, as a dict."""
    return {
        "backend_name": "hicache-pipeline",
        "module_path": "pipeline.integrations.sglang",
        "class_name": "PipelineStorage",
        "interface_v1": 1,
        "storage": storage,
        **more,
    }


Span = tuple[int, int]
"""Where a unit's buffer starts in memory, and its bytes."""


def recorded(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[Span]]]:
    """Each read's and write's unit buffers given to the store (after the header), as it
    runs: a page at a time ("put", "read") or a batch of pages ("put_many", "read_units")."""
    moved: list[tuple[str, list[Span]]] = []
    put, read = store.put, store.read
    units_reader, units_writer = store.units_reader, store.units_writer

    def spans(views: list[Any]) -> list[Span]:
        return [(np.frombuffer(v, np.uint8).ctypes.data, memoryview(v).nbytes) for v in views]

    def putting(name: str, parts: list[memoryview]) -> None:
        moved.append(("put", spans(parts[1:])))
        put(name, parts)

    def reading(name: str, size: int, ranges: list[Any], check: Any = None) -> bool:
        moved.append(("read", spans([v for _, views in ranges for v in views][1:])))
        return bool(read(name, size, ranges, check))

    def reader() -> Any:
        found = units_reader()
        if found is not None:
            real = found.read_units

            def read_units(reads: Any) -> int:
                units = np.flatnonzero(np.diff(reads.objects, prepend=-1) == 0)  # no header
                at, nbytes = reads.addresses[units].tolist(), reads.nbytes[units].tolist()
                moved.append(("read_units", list(zip(at, nbytes, strict=True))))
                return int(real(reads))

            found.read_units = read_units
        return found

    def writer() -> Any:
        found = units_writer()
        if found is not None:
            real = found.put_many

            def put_many(objects: Any, tables: Any = None, units: Any = None) -> None:
                moved.append(("put_many", [s for _, p in objects for s in spans(p[1:])]))
                real(objects, tables, units)

            found.put_many = put_many
        return found

    monkeypatch.setattr(store, "put", putting)
    monkeypatch.setattr(store, "read", reading)
    monkeypatch.setattr(store, "units_reader", reader)
    monkeypatch.setattr(store, "units_writer", writer)
    return moved


def in_pool(pool: HostPool, span: Span) -> bool:
    (start, nbytes), first = span, pool.kv_buffer.data_ptr()
    return first <= start and start + nbytes <= first + pool.kv_buffer.nbytes


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("mla", KINDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_of_every_layout_round_trip_bit_exact(
    layout: str,
    mla: bool,
    store: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = host_pool(layout, mla, page_num=8, page_size=4, layer_num=3)
    pool.fill(seed=1)
    backend = built(extra(store_config(store, tmp_path, request)), pool, mla=mla)
    assert isinstance(backend, PipelineStorage)
    moved = recorded(backend.io.store, monkeypatch)
    try:
        written = [1, 6, 3]
        assert backend.batch_set_v1(HASHES[:3], slots(written, 4)) == [True] * 3
        assert backend.batch_exists(HASHES) == 3  # the leading hit count
        before = [pool.layer_rows(p).clone() for p in written]
        pool.kv_buffer.zero_()
        assert backend.batch_get_v1(HASHES[:3], slots([0, 2, 7], 4)) == [True] * 3
        for page, rows in zip([0, 2, 7], before, strict=True):
            assert torch.equal(pool.layer_rows(page), rows)
        assert backend.batch_get_v1(HASHES[3:4], slots([5], 4)) == [False]  # never written
        counts = backend.counts()
        assert (counts["writes"], counts["hits"], counts["misses"]) == (3, 3, 1)
        # zero-copy: every unit leaves from and lands in the pool itself, in one call a
        # batch, except page_first's strided pages, staged whole a page at a time (host_pages.
        # HostPages.direct says why) but where the file store reads them, row by row
        inside = {(call, in_pool(pool, unit)) for call, units in moved for unit in units}
        if layout != "page_first":  # each batch call one store call
            assert inside == {("put_many", True), ("read_units", True)}
            assert [call for call, _ in moved] == ["put_many", "read_units", "read_units"]
            # the file store sums as it writes: a page whose units lie end to end in the
            # pool as in its object is one buffer (MLA's page_first_direct; MHA's holds a
            # page's K then its V, the object a layer's K and V), else a buffer a unit
            one = (store, layout, mla) == ("file", "page_first_direct", True)
            each = 1 if one else 3 * (1 + (not mla))
            assert len(moved[0][1]) == len(written) * each
        else:
            read = ("read_units", True) if store == "file" else ("read", False)
            assert inside == {("put", False), read}
    finally:
        backend.close()


@pytest.mark.parametrize("mla", KINDS)
def test_an_object_reads_into_any_layout(mla: bool, tmp_path: Path) -> None:
    """One stored form per page whatever the layout that wrote it."""
    config = extra({"kind": "file", "path": str(tmp_path)})
    pools = {
        layout: host_pool(layout, mla, page_num=4, page_size=4, layer_num=3) for layout in LAYOUTS
    }
    pools["page_first"].fill(seed=2)
    writer = built(config, pools["page_first"], mla=mla)
    assert writer.batch_set_v1(HASHES[:2], slots([0, 3], 4)) == [True, True]
    writer.close()
    for layout in ("layer_first", "page_first_direct"):
        reader = built(config, pools[layout], mla=mla)
        assert reader.batch_get_v1(HASHES[:2], slots([2, 1], 4)) == [True, True]
        reader.close()
        for theirs, mine in ((0, 2), (3, 1)):
            assert torch.equal(
                pools[layout].layer_rows(mine), pools["page_first"].layer_rows(theirs)
            )


def test_sglang_pages_are_the_projects_objects(tmp_path: Path) -> None:
    """An MLA pool of tiny_mla's geometry, keyed under its name: the project's scheduler
    view finds what SGLang wrote, by SGLang's own hashes."""
    pool = host_pool("layer_first", True, page_num=4, page_size=4, layer_num=5)
    backend = built(extra({"kind": "file", "path": str(tmp_path)}, model="tiny_mla"), pool)
    backend.batch_set_v1(HASHES[:3], slots([0, 1, 2], 4))
    backend.close()
    job = pipeline.compose(
        ["model=tiny_mla", "topology=tp1", "storage=file", f"storage.path={tmp_path}"]
    )
    with pipeline.open_store(job) as view:
        assert view.lookup(pipeline.page_keys(job, HASHES)) == 3


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_a_corrupt_or_truncated_object_is_a_miss(
    layout: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pool = host_pool(layout, True, page_num=8, page_size=4, layer_num=3)
    pool.fill(seed=3)
    backend = built(extra(store_config(store, tmp_path, request)), pool)
    try:
        backend.batch_set_v1(HASHES[:3], slots([0, 1, 2], 4))
        io = backend.io
        names = [io.name(key) for key in backend._keys(HASHES[:3])]
        flipped = bytearray(io.store.get(names[1]))
        flipped[-5] ^= 0x40  # a byte of the last unit
        io.store.put(names[1], [bytes(flipped)])
        io.store.put(names[2], [io.store.get(names[2])[:-1]])
        target = [5, 6, 7]
        before = [pool.layer_rows(p).clone() for p in target]
        assert backend.batch_exists(HASHES[:3]) == 3  # present: only a read checks bytes
        assert backend.batch_get_v1(HASHES[:3], slots(target, 4)) == [True, False, False]
        assert torch.equal(pool.layer_rows(5), pool.layer_rows(0))
        if layout == "page_first" and store != "file":
            # staged (Mooncake lands no rows a pitch apart): written only once it checked out
            assert all(
                torch.equal(pool.layer_rows(p), b)
                for p, b in zip(target[1:], before[1:], strict=True)
            )
        assert backend.counts()["corrupt_objects"] == 1  # the truncated one: a plain miss
    finally:
        backend.close()


def test_bad_input_is_refused_before_a_byte_moves(tmp_path: Path) -> None:
    pool = host_pool("layer_first", True, page_num=4, page_size=4, layer_num=3)
    pool.fill(seed=4)
    backend = built(extra({"kind": "file", "path": str(tmp_path)}), pool)
    before = pool.kv_buffer.clone()
    wrong = {
        "3 slots for 1 keys": (HASHES[:1], torch.arange(3)),
        "one whole host page": (HASHES[:1], torch.arange(1, 5)),
        "outside the host pool": (HASHES[:1], torch.arange(16, 20)),
        "integer token slots": (HASHES[:1], torch.arange(4, dtype=torch.float32)),
        "a host page named twice": (HASHES[:2], slots([1, 1], 4)),
        "keys repeat": ([HASHES[0], HASHES[0]], slots([1, 2], 4)),
        r"hashes\[0\]: a NoneType is not a block hash": ([None], slots([1], 4)),
    }
    for message, (keys, indices) in wrong.items():
        for call in (backend.batch_set_v1, backend.batch_get_v1):
            with pytest.raises(ValueError, match=message):
                call(keys, indices)
    assert torch.equal(pool.kv_buffer.view(torch.uint8), before.view(torch.uint8))
    assert backend.batch_exists(HASHES) == 0 and not list(tmp_path.rglob("*/*/*"))
    backend.close()


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ({"interface_v1": 0}, ValueError, "interface_v1"),
        ({"colour": "blue"}, ValueError, r"unknown keys \['colour'\]"),
        ({"storage": {"kind": "s3"}}, ValueError, "storage.kind='s3'"),
        ({"storage": {"kind": "file"}}, ValueError, "storage.path"),
        ({"storage": {"kind": "file", "path": "/x", "depth": 1}}, ValueError, "unknown keys"),
        ({"storage": {"kind": "mooncake"}}, ValueError, "storage.master"),
    ],
)
def test_a_bad_extra_config_is_a_clear_error(
    config: dict[str, Any], error: type, message: str
) -> None:
    pool = host_pool("layer_first", True, page_num=2, page_size=4, layer_num=1)
    with pytest.raises(error, match=message):
        built({**extra({"kind": "file", "path": "/x"}), **config}, pool)


def test_what_is_not_supported_says_so(tmp_path: Path) -> None:
    config = extra({"kind": "file", "path": str(tmp_path)})
    with pytest.raises(NotImplementedError, match="host layout 'page_head'"):
        built(
            config, host_pool("page_head", False, page_num=2, page_size=4, layer_num=1), mla=False
        )

    class MHATokenToKVPoolMXFP8Host(MHATokenToKVPoolHost):
        """SGLang's MXFP8 pool keeps its scales beside kv_buffer: not served."""

    mxfp8 = MHATokenToKVPoolMXFP8Host("layer_first", False, page_num=2, page_size=4, layer_num=1)
    with pytest.raises(NotImplementedError, match="host pool MHATokenToKVPoolMXFP8Host"):
        built(config, mxfp8, mla=False)
    with pytest.raises(NotImplementedError, match="context parallel"):
        built(
            config,
            host_pool("layer_first", True, page_num=2, page_size=4, layer_num=1),
            attn_cp_size=2,
        )
    backend = built(config, host_pool("layer_first", True, page_num=2, page_size=4, layer_num=1))
    with pytest.raises(NotImplementedError, match="batch_get_v1"):
        backend.batch_get(HASHES[:1], [None])
    with pytest.raises(NotImplementedError):
        backend.batch_get_v2([])  # SGLang's own: the v2 pool transfers are not served
    backend.close()


def test_the_file_store_follows_no_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "l3", tmp_path / "outside"
    pool = host_pool("page_first_direct", True, page_num=4, page_size=4, layer_num=2)
    pool.fill(seed=5)
    backend = built(extra({"kind": "file", "path": str(root)}), pool)
    backend.batch_set_v1(HASHES[:1], slots([0], 4))
    (name,) = [backend.io.name(k) for k in backend._keys(HASHES[:1])]
    prefix = root / name.rpartition("/")[0]
    outside.mkdir()
    prefix.rename(outside / "moved")  # the object now lies outside, behind a link
    prefix.symlink_to(outside / "moved")
    assert backend.batch_exists(HASHES[:1]) == 0
    assert backend.batch_get_v1(HASHES[:1], slots([1], 4)) == [False]
    assert backend.batch_set_v1(HASHES[:1], slots([0], 4)) == [False]  # nothing written there
    assert sorted(os.listdir(outside / "moved")) == [name.rpartition("/")[2]]
    backend.close()


def test_a_bounded_file_store_evicts_the_least_recently_used(tmp_path: Path) -> None:
    pool = host_pool("layer_first", True, page_num=8, page_size=4, layer_num=2, kv_cache_dim=512)
    pool.fill(seed=6)  # 8 KiB pages: objects, not the room kept for a header, fill the store
    probe = built(extra({"kind": "file", "path": str(tmp_path / "probe")}), pool)
    object_bytes = probe.io.size
    probe.close()
    capacity = 5 * object_bytes
    backend = built(
        extra(
            {
                "kind": "file",
                "path": str(tmp_path / "l3"),
                "capacity_bytes": capacity,
                "evict_to": 0.8,
            }
        ),
        pool,
    )
    for first in range(0, 6, 2):
        assert (
            backend.batch_set_v1(HASHES[first : first + 2], slots([first, first + 1], 4))
            == [True] * 2
        )
    counts = backend.counts()
    assert counts["evictions"] > 0 and counts["bytes"] <= capacity
    assert backend.batch_exists(HASHES[4:]) == 2  # the latest write-back stays
    backend.close()


def test_a_keyed_store_reads_no_unkeyed_object(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(bytes(range(32)))
    key_file.chmod(0o600)
    pool = host_pool("layer_first", True, page_num=4, page_size=4, layer_num=2)
    plain = built(extra({"kind": "file", "path": str(tmp_path / "l3")}), pool)
    plain.batch_set_v1(HASHES[:1], slots([0], 4))
    plain.close()
    keyed = built(
        extra({"kind": "file", "path": str(tmp_path / "l3"), "auth_key_file": str(key_file)}), pool
    )
    assert keyed.batch_get_v1(HASHES[:1], slots([1], 4)) == [False]
    assert keyed.counts()["forged_objects"] == 1
    keyed.close()


def test_a_second_pool_attaches_to_the_same_store(tmp_path: Path) -> None:
    """SGLang attaches storage again after a detach: a new host pool, the same objects."""
    first = host_pool("page_first", True, page_num=4, page_size=4, layer_num=2)
    first.fill(seed=7)
    backend = built(extra({"kind": "file", "path": str(tmp_path)}), first)
    backend.batch_set_v1(HASHES[:2], slots([0, 1], 4))
    second = host_pool("page_first_direct", True, page_num=4, page_size=4, layer_num=2)
    backend.register_mem_pool_host(second)
    assert backend.batch_get_v1(HASHES[:2], slots([3, 2], 4)) == [True, True]
    assert torch.equal(second.layer_rows(3), first.layer_rows(0))
    assert backend.get_stats() is None  # SGLang's metrics only with --enable-metrics
    backend.close()


@pytest.mark.parametrize(
    ("mla", "reader", "found"),
    [
        pytest.param(True, {"tp_rank": 1}, 2, id="mla-another-tp-rank-finds-them"),
        pytest.param(False, {"tp_rank": 1}, 0, id="mha-another-tp-rank-holds-other-heads"),
        pytest.param(False, {"tp_size": 1}, 0, id="mha-another-tp-size"),
        pytest.param(True, {"pp_rank": 1}, 0, id="another-pipeline-stage"),
    ],
)
def test_ranks_share_objects_only_where_they_hold_the_same_bytes(
    mla: bool, reader: dict[str, int], found: int, tmp_path: Path
) -> None:
    config = extra({"kind": "file", "path": str(tmp_path)})
    pool = host_pool("layer_first", mla, page_num=4, page_size=4, layer_num=2)
    ranks = {"tp_rank": 0, "tp_size": 2, "pp_rank": 0, "pp_size": 2}
    writer = built(config, pool, mla=mla, **ranks)
    writer.batch_set_v1(HASHES[:2], slots([0, 1], 4))
    other = built(config, pool, mla=mla, **{**ranks, **reader})
    assert other.batch_exists(HASHES[:2]) == found
    writer.close()
    other.close()


@pytest.mark.mooncake
def test_an_explicit_stream_layers_keeps_the_objects_in_mooncake_as_the_engine_cuts_them(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`storage.stream_layers=N` cuts the backend's Mooncake objects into a piece a group, as
    the engine's ranks cut theirs (one stored form): written, held as pieces, read back."""
    pool = host_pool("layer_first", True, page_num=8, page_size=4, layer_num=5)
    pool.fill(seed=4)
    storage = {**store_config("mooncake", tmp_path, request), "stream_layers": 2}
    backend = built(extra(storage), pool)
    try:
        backend.batch_set_v1(HASHES[:2], slots([0, 1], 4))
        io = backend.io
        for key in backend._keys(HASHES[:2]):
            forms = io.store.pieces.forms(io.name(key))
            assert io.store.held(forms) == [False] + [True] * (len(forms) - 1)
            assert len(forms) - 1 == len(range(1, 5, 2)) + 1  # layer 0, then 2 a piece
        assert backend.batch_get_v1(HASHES[:2], slots([5, 6], 4)) == [True, True]
        assert torch.equal(pool.layer_rows(5), pool.layer_rows(0))
        assert torch.equal(pool.layer_rows(6), pool.layer_rows(1))
    finally:
        backend.close()
    with pytest.raises(ValueError, match="stream_layers=-1 must be >= 0"):
        built(extra({**storage, "stream_layers": -1}), pool)
