"""A write-back's objects written in one native call (`pipeline.engine.l3.writes`,
`_fileio.write_objects`, `FileStore.put_many`): each lands whole under its name or not at all
(a temporary file renamed over it, relative to its folder: no link followed), bit-exact and
readable as `put` writes it, its time its first use; a failure names its object, leaves no
temporary file and the rest of the batch written; a bounded store makes room for a batch at
once."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

from pipeline.core.l3 import CHECK_AT, Checks, header, table_at
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3 import writes
from pipeline.engine.l3.stores import FileStore, file_writes, open_store
from pipeline.engine.l3.stores._fileio import crcs_of, write_objects
from pipeline.jobs.contents import first_mismatch
from pipeline.jobs.l3_store import concrete
from tests.unit.test_l3_stream import PAGES, engine_with, load, stored_prefix
from tests.unit.test_unit_reads import Spy


def parts_of(seed: int, count: int, size: int) -> list[memoryview]:
    rng = np.random.default_rng(seed)
    return [
        memoryview(rng.integers(0, 256, size + k % 3, np.uint8).tobytes()) for k in range(count)
    ]


@pytest.mark.parametrize("threads", [1, 3])
def test_each_object_lands_whole_under_its_name_with_its_time_now(
    tmp_path: Path, threads: int
) -> None:
    """Objects of 1, 600 (more than one gathering write) and 3 parts, one of them empty, in
    two folders: each file is its parts end to end, its access and modification times the
    moment it was written (to the nanosecond, not the file system's tick); no temporary
    file stays; an object written again replaces the old one whole."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    objects = [parts_of(1, 1, 5000), parts_of(2, 600, 70), [b"head", memoryview(b""), b"tail"]]
    folders = [os.open(tmp_path / f, os.O_RDONLY | os.O_DIRECTORY) for f in ("a", "b", "a")]
    try:
        before = time.time_ns()
        tmps, leaves = [f".tmp-{k:016x}" for k in range(3)], ["x", "y", "z"]
        fds = np.array(folders, np.int32)
        assert write_objects(fds, tmps, leaves, objects, threads) == [0, 0, 0]
        after = time.time_ns()
        for folder, leaf, parts in zip(["a", "b", "a"], leaves, objects, strict=True):
            path = tmp_path / folder / leaf
            info = os.stat(path)  # before the read below sets its access time
            assert before <= info.st_mtime_ns == info.st_atime_ns <= after
            assert path.read_bytes() == b"".join(bytes(p) for p in parts)
        assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "x", "y", "z"]
        again = [[b"new"]]
        assert write_objects(fds[:1], [".tmp-" + "f" * 16], ["x"], again, threads) == [0]
        assert (tmp_path / "a" / "x").read_bytes() == b"new"
    finally:
        for fd in folders:
            os.close(fd)


def test_a_failed_object_leaves_nothing_of_its_own_and_the_rest_written(tmp_path: Path) -> None:
    """A temporary name already taken (never opened through: O_EXCL, no link followed), a
    final name that is a folder (the rename fails; the temporary is removed), a folder not
    open: each answers its errno; the object beside them is written. A name that is not one
    component of its folder (a '/', '.', '..', empty) is refused before any write."""
    os.symlink(tmp_path / "elsewhere", tmp_path / ".tmp-taken")
    (tmp_path / "dir").mkdir()
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds = np.array([root, root, root, 10_000], np.int32)
        tmps = [".tmp-taken", ".tmp-0000000000000001", ".tmp-0000000000000002", ".tmp-3"]
        leaves = ["one", "dir", "fine", "gone"]
        errors = write_objects(fds, tmps, leaves, [[b"1"], [b"2"], [b"3"], [b"4"]], 2)
        assert errors[0] == 17 and errors[1] in (21, 39) and errors[2] == 0 and errors[3] == 9
        assert not (tmp_path / "elsewhere").exists() and (tmp_path / "fine").read_bytes() == b"3"
        assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-taken", "dir", "fine"]
        assert list((tmp_path / "dir").iterdir()) == []
        for bad in ("a/b", "..", ".", ""):
            with pytest.raises(ValueError, match=r"empty, '\.', '\.\.', or holds a NUL or a '/'"):
                write_objects(fds[:1], [".tmp-5"], [bad], [[b"x"]], 1)
        with pytest.raises(ValueError, match="2 names for 1 objects"):
            write_objects(fds[:1], ["a", "b"], ["c"], [[b"x"]], 1)
    finally:
        os.close(root)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_summed_write_is_the_object_a_sum_then_a_write_makes(
    tmp_path: Path, threads: int
) -> None:
    """`write_objects` with `tables`: each unit summed as it is written into its header's
    table, then the header's check: the file is byte for byte the header `core.l3.header`
    makes of the units' CRC-32C, then the units (600 units: more than one gathering write, one
    empty; one unit alone). A header without room for its table or its check is refused
    before any file is made."""
    space, units = "ns", [parts_of(3, 600, 70), parts_of(4, 1, 5000)]
    units[0][7] = memoryview(b"")
    names = ["a" * 32, "b" * 32]
    blank = [
        bytearray(header(space, n, [0] * len(u), [p.nbytes for p in u], Checks()))
        for n, u in zip(names, units, strict=True)
    ]
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds, tmps = np.array([folder, folder], np.int32), [".tmp-0", ".tmp-1"]
        objects = [[h, *u] for h, u in zip(blank, units, strict=True)]
        tables = np.array([table_at(space, n) for n in names], np.int64)
        assert write_objects(fds, tmps, names, objects, threads, tables, CHECK_AT) == [0, 0]
        for name, parts in zip(names, units, strict=True):
            sizes, digests = [p.nbytes for p in parts], [crc32c.crc32c(p) for p in parts]
            want = header(space, name, digests, sizes, Checks()) + b"".join(parts)
            assert (tmp_path / name).read_bytes() == want
        short = [bytearray(8), *units[1]]
        for tables_at, check_at in [([table_at(space, "c")], CHECK_AT), ([0], len(blank[1]))]:
            with pytest.raises(ValueError, match="object 0: a header of"):
                write_objects(fds[:1], tmps[:1], ["c"], [short], 1, np.array(tables_at), check_at)
        with pytest.raises(BufferError):  # the header is filled in: a bytes one is refused
            write_objects(fds[:1], tmps[:1], ["c"], [[bytes(blank[1]), *units[1]]], 1, tables[1:])
        assert sorted(p.name for p in tmp_path.iterdir()) == names
    finally:
        os.close(folder)


@pytest.mark.parametrize("split", [[], [3], [1, 2, 5]], ids=["one", "two", "four"])
@pytest.mark.parametrize("threads", [1, 3])
def test_a_page_in_one_buffer_is_cut_into_its_units_as_it_is_summed(
    tmp_path: Path, threads: int, split: list[int]
) -> None:
    """`write_objects` with `units`: an object's payload given as runs of whole units end
    to end (one buffer a page, or cut at unit boundaries `split`) is the file a part a unit
    makes: each unit's CRC-32C in its row (empty units, units across a CHUNK, a run larger
    than one). Parts that are not whole units, or hold too few, are refused before any file
    is made, and so are units without tables."""
    space, name = "ns", "a" * 32
    units = parts_of(5, 9, 70_000)
    units[2], units[6] = memoryview(b""), memoryview(b"x" * 1_200_000)
    lengths = np.array([u.nbytes for u in units], np.int64)
    blank = bytearray(header(space, name, [0] * len(units), lengths.tolist(), Checks()))
    cuts = [0, *split, len(units)]
    payload = [memoryview(b"".join(units[a:b])) for a, b in itertools.pairwise(cuts)]
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fds, tables = np.array([folder], np.int32), np.array([table_at(space, name)], np.int64)

        def write(parts: list[Any], cut: np.ndarray | None, *rest: Any) -> list[int]:
            return write_objects(fds, [".tmp-0"], [name], [parts], threads, *rest, cut)

        assert write([blank, *payload], lengths, tables, CHECK_AT) == [0]
        digests = [crc32c.crc32c(u) for u in units]
        want = header(space, name, digests, lengths.tolist(), Checks()) + b"".join(units)
        assert (tmp_path / name).read_bytes() == want
        (tmp_path / name).unlink()
        whole = memoryview(b"".join(units))
        for parts, match in [
            ([blank, whole[:100], whole[100:]], "its part 0 is not whole units"),
            ([blank, whole[: -units[-1].nbytes]], "its parts hold 8 of 9 units"),
        ]:
            with pytest.raises(ValueError, match=match):
                write(parts, lengths, tables, CHECK_AT)
        with pytest.raises(ValueError, match="units: only with tables"):
            write([blank, whole], lengths, None, 0)
        assert not list(tmp_path.iterdir())
    finally:
        os.close(folder)


@pytest.mark.parametrize("capacity", [None, 1 << 20], ids=["unbounded", "bounded"])
def test_the_store_writes_many_as_it_puts_one_and_names_a_failure(
    tmp_path: Path, capacity: int | None
) -> None:
    """`put_many` in folders made as needed: each object reads back as `put` would leave it,
    counted (a bounded store's ledger too: all renamed in under one admission); one whose
    name is taken by a folder fails the call naming it, after the others are written."""
    store = FileStore(str(tmp_path), threads=2, capacity_bytes=capacity)
    try:
        assert store.units_writer() is store
        objects = [(f"ns/{k:02x}/key{k}", [b"h%d" % k, *parts_of(k, 3, 100)]) for k in range(5)]
        store.put_many(objects)
        for name, parts in objects:
            assert store.get(name) == b"".join(bytes(p) for p in parts)
        assert store.counters.snapshot()["writes"] == 5
        sizes = sum(sum(memoryview(p).nbytes for p in parts) for _, parts in objects)
        if store.bound is not None:
            assert store.bound.held() == (sizes, 5)
        (tmp_path / "ns/01/blocked").mkdir()
        with pytest.raises(OSError, match="ns/01/blocked: Is a directory"):
            store.put_many([("ns/01/blocked", [b"x"]), ("ns/02/after", [b"y"])])
        assert store.get("ns/02/after") == b"y"
        assert not [p for p in tmp_path.rglob(".tmp-*")]
    finally:
        store.close()


def test_a_writes_units_are_summed_on_threads_as_on_one() -> None:
    parts = [*parts_of(7, 40, 3000), memoryview(b"")]
    assert crcs_of(parts, 4) == crcs_of(parts) == [crc32c.crc32c(p) for p in parts]


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    ("overrides", "parts"),
    [
        (["topology.mem_layout=page_first_direct"], "a page"),
        (["topology.mem_layout=layer_first"], "a unit"),
        (["topology.mem_layout=page_first"], ""),  # staged: a page a task
        (["topology.mem_layout=page_first_direct", "storage.capacity_bytes=64MiB"], "a page"),
    ],
    ids=["page_first_direct", "layer_first", "page_first", "bounded"],
)
def test_a_write_back_goes_in_one_call_where_it_can_and_loads_back_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], parts: str
) -> None:
    """Every page of the write-back in one `put_many` call (5 pages, though a rotating owner
    would send 4 at a time on 2 I/O threads), each unit summed as the store writes it, where
    the pool holds the units as bytes and the store is unbounded; else one `put` a page.
    Each object is its header and its page: a buffer a page where the pool holds the page's
    units end to end (page_first_direct; the store cuts it into units), else a buffer a unit.
    Either way the pages load back bit-exact."""
    calls: list[tuple[int, set[int], list[int]]] = []
    real = FileStore.put_many

    def put_many(store: FileStore, objects: Any, tables: Any = None, units: Any = None) -> None:
        calls.append((len(objects), {len(p) for _, p in objects}, units))
        assert tables is not None  # the store sums the units as it writes them
        real(store, objects, tables, units)

    monkeypatch.setattr(FileStore, "put_many", put_many)
    puts: list[str] = []
    real_put = FileStore.put
    monkeypatch.setattr(FileStore, "put", lambda s, n, p: (puts.append(n), real_put(s, n, p)))
    with engine_with(tmp_path, "storage.io_threads=2", *overrides) as engine:
        keys, expected = stored_prefix(engine)
        lengths = [u.page_bytes for u in engine.l3.object.units]
        each = {"a page": 2, "a unit": 1 + len(lengths)}.get(parts)
        assert (calls, len(puts)) == (([(PAGES, {each}, lengths)], 0) if each else ([], PAGES))
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        assert not first_mismatch(engine, target, expected)
    assert writes.write_pages.__module__ == "pipeline.engine.l3.writes"


def test_a_native_call_leaves_the_callers_signals_alone() -> None:
    """Its own threads block every signal; the calling thread (which works too) keeps its
    mask, so Ctrl-C still reaches the interpreter's main thread."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert crcs_of(parts_of(3, 8, 1000), 1) == crcs_of(parts_of(3, 8, 1000), 4)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_a_put_whose_temporary_name_is_taken_removes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file already under the temporary name a put draws (planted, or another writer's)
    refuses the put (O_EXCL) and stays: only a temporary the put made is ever removed."""
    store = FileStore(str(tmp_path))
    try:
        (tmp_path / "ns").mkdir()
        planted = tmp_path / "ns" / ".tmp-0000000000000000"
        planted.write_bytes(b"not the store's")
        monkeypatch.setattr(file_writes.secrets, "token_hex", lambda n: "0" * 2 * n)
        with pytest.raises(FileExistsError):
            store.put("ns/key", [b"x"])
        assert planted.read_bytes() == b"not the store's" and store.get("ns/key") is None
    finally:
        store.close()


@pytest.mark.mooncake
def test_mooncake_writes_new_objects_in_one_call_and_replaces_old_ones_by_upsert() -> None:
    """New objects whose pages lie in registered memory go in one client call per staging
    buffer of headers, each reading back as `put` leaves it; an object the store holds is
    replaced whole (the client's put would keep it), and one whose parts outside registered
    memory outgrow a staging buffer is put alone; a failed put is raised naming its object
    after the others are written."""
    with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, 4096)
        try:
            pool = np.random.default_rng(5).integers(0, 256, 8 * 1000, np.uint8)
            store.register([pool.data])
            page = [memoryview(pool[k * 1000 : (k + 1) * 1000]) for k in range(8)]
            writer = store.units_writer()
            assert writer is not None
            calls: Counter[str] = Counter()
            store.client = Spy(store.client, calls)  # type: ignore[attr-defined]
            objects = [(f"ns/ab/k{k}", [b"head%d" % k * 200, page[k]]) for k in range(6)]
            store.put("ns/ab/k0", [b"old"])
            loose = np.random.default_rng(6).integers(0, 256, 5000, np.uint8)  # not registered
            objects.append(("ns/ab/loose", [b"h", memoryview(loose)]))
            writer.put_many(objects)
            for name, parts in objects:
                assert store.get(name) == b"".join(bytes(p) for p in parts), name
            # headers of 1200 bytes: 3 fit a 4096-byte staging buffer, so k1-k5 take 2 calls
            assert calls["batch_put_from_multi_buffers"] == 2 and calls["upsert_parts"] == 3
            big = np.zeros(80 << 20, np.uint8)  # more than the store's 64 MiB segment
            store.register([big.data])
            written = store.counters.snapshot()["writes"]
            with pytest.raises(RuntimeError, match="Mooncake put of ns/ab/k7 returned"):
                writer.put_many([("ns/ab/k6", [b"h", page[6]]), ("ns/ab/k7", [b"h", big.data])])
            # k6 was written (the client returned 0 for it); the master may evict it at once
            # under the pressure the failed 80 MiB put made, so a read finds it whole or not
            assert store.counters.snapshot()["writes"] == written + 1
            assert store.get("ns/ab/k6") in (b"h" + bytes(page[6]), None)
            store.unregister([pool.data, big.data])
        finally:
            store.close()
