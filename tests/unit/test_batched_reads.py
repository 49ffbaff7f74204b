"""A run of pages read in one native call (`pipeline.engine.l3.batch`, `stores/_fileio.c`): the
CRC-32C is the `crc32c` package's, every range lands whole with its CRC or the call stops there,
a load of pages the host pool holds as bytes reads only through it (a run per I/O thread, no
read a page), bit-exact, and a bad object ends the hits at its page, counted as what it is."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

from pipeline.core.l3 import Checks, PageObject, header, unit_digests
from pipeline.core.l3_rows import header_rows, headers_of
from pipeline.engine.l3 import fetch
from pipeline.engine.l3.pages import unit_columns
from pipeline.engine.l3.stores import FileStore
from pipeline.engine.l3.stores._fileio import CHUNK, SUM, SUMS, crcs_of, present, read_objects
from pipeline.engine.l3.stores._fileio import crc32c as native_crc
from pipeline.engine.l3.stores.file_parts import FileParts
from pipeline.jobs.contents import first_mismatch
from tests.unit.test_l3 import DSA, SPACE
from tests.unit.test_l3_stream import PAGES, engine_with, load, stored_prefix

LENGTHS = [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 80, 127, 128, 255, 767, 768, 769, 24575, 24583]
LENGTHS += [73728, CHUNK + 3]


def has(how: str) -> bool:
    try:
        native_crc(b"", 0, how)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("how", [h for h in SUMS if has(h)])
@pytest.mark.parametrize("length", LENGTHS)
def test_each_native_crc_is_the_crc32c_packages(length: int, how: str) -> None:
    """Each sum this CPU has, at every length around its blocks (3 x 8 KiB and 3 x 256 B
    streams, 64- and 16-byte folds), at every alignment, and extended from a CRC so far."""
    data = np.random.default_rng(length).integers(0, 256, length + 8, dtype=np.uint8).tobytes()
    for at in range(8):
        assert native_crc(data[at : at + length], 0, how) == crc32c.crc32c(data[at : at + length])
    half = length // 2
    head = native_crc(data[:half], 0, how)
    assert native_crc(data[half:length], head, how) == crc32c.crc32c(data[:length])


def test_a_writes_units_are_summed_in_one_call_as_the_package_sums_each() -> None:
    """`crcs_of` (a write's digests, one call a page): every buffer kind a write holds, empty
    ones too; anything not a buffer is refused."""
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, 5 * CHUNK, dtype=np.uint8)
    parts = [pool.data[:0], pool.data[7 : 7 + 73728], bytes(pool[:100]), bytearray(b"x" * 65)]
    parts.append(memoryview(pool)[CHUNK:])
    assert crcs_of(parts) == [crc32c.crc32c(p) for p in parts]
    assert crcs_of([]) == []
    with pytest.raises(TypeError):
        crcs_of([b"ok", 3])


def test_reads_sum_with_a_sum_this_cpu_has_and_another_is_refused() -> None:
    assert SUM in SUMS and has(SUM) and native_crc(b"123456789") == 0xE3069283
    with pytest.raises(ValueError, match="no CRC-32C sum 'sha' on this CPU"):
        native_crc(b"", 0, "sha")


@pytest.mark.parametrize("lengths", ["one", "mixed"])
def test_headers_side_by_side_are_trusted_exactly_as_one_at_a_time(lengths: str) -> None:
    """Each of four headers in rows, with every single byte of the third flipped in turn:
    a row is intact exactly where `unit_digests` trusts it, with the same digest table (in
    bulk for names of one length, a row at a time otherwise)."""
    obj, checks = PageObject("", DSA.units), Checks()
    names = [f"ns/ab/{k:02d}{'x' * (k if lengths == 'mixed' else 0)}" for k in range(4)]
    digests = [
        [(k * 7 + j) * 2654435761 % (1 << 32) for j in range(len(obj.units))] for k in range(4)
    ]
    heads = [
        header(SPACE, n, d, [u.page_bytes for u in obj.units], checks)
        for n, d in zip(names, digests, strict=True)
    ]
    width = max(len(h) for h in heads)
    rows = np.zeros((4, width), np.uint8)
    for k, h in enumerate(heads):
        rows[k, : len(h)] = np.frombuffer(h, np.uint8)
    ok, tables = header_rows(rows, obj, SPACE, names, checks)
    assert ok.all() and tables.tolist() == digests
    for at in range(len(heads[2])):
        rows[2, at] ^= 0x10
        ok, _ = header_rows(rows, obj, SPACE, names, checks)
        alone = unit_digests(rows[2, : len(heads[2])].data, obj, SPACE, names[2], checks)
        assert ok.tolist() == [True, True, alone is not None, True]
        rows[2, at] ^= 0x10


@pytest.mark.parametrize("names", [[], ["ns/ab/k1"], ["ns/ab/k1", "ns/cd/k2"], ["é/k", "e/k1"]])
def test_headers_made_side_by_side_are_the_headers_made_one_at_a_time(names: list[str]) -> None:
    """A write-back's headers in bulk (`headers_of`: names of one length, in bytes; else one
    at a time) are byte for byte `header`'s, writable, and trusted by `header_rows`."""
    obj, checks = PageObject("", DSA.units), Checks()
    lengths = [u.page_bytes for u in obj.units]
    shape = (len(names), len(lengths))
    digests = np.arange(shape[0] * shape[1], dtype=np.uint32).reshape(shape)
    digests *= 2654435761 % (1 << 32)
    made = headers_of(SPACE, names, digests, lengths, checks)
    assert [bytes(h) for h in made] == [
        header(SPACE, n, d, lengths, checks) for n, d in zip(names, digests.tolist(), strict=True)
    ]
    assert all(not h.readonly for h in made)
    if names and len({len(n.encode()) for n in names}) == 1:
        rows = np.array([np.frombuffer(h, np.uint8) for h in made])
        ok, tables = header_rows(rows, obj, SPACE, names, checks)
        assert ok.all() and tables.tolist() == digests.tolist()


Read = tuple[int, int, int]  # object, offset, length


def call(
    files: Any, sizes: list[int], reads: list[Read], ends: list[int], threads: int, **kw: Any
) -> tuple[tuple[int, int], np.ndarray, np.ndarray]:
    """read_objects over `reads`, end to end in one buffer: (its answer, the buffer, CRCs)."""
    nbytes = np.array([n for _, _, n in reads], np.int64)
    into = np.zeros(int(nbytes.sum()) + 1, np.uint8)
    at = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(np.uint64)
    crcs = np.zeros(len(reads), np.uint32)
    found = read_objects(
        files,
        np.array(sizes, np.int64),
        kw.pop("used", False),
        np.array([o for o, _, _ in reads], np.int64),
        np.array([off for _, off, _ in reads], np.int64),
        into.ctypes.data + at,
        nbytes,
        crcs,
        np.array(ends, np.int64),
        threads,
        kw.pop("on_group", None),
    )
    return found, into, crcs


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("missing", [None, 0, 4])
def test_a_loads_ranges_land_with_their_crcs_on_any_threads_up_to_a_missing_object(
    tmp_path: Path, threads: int, groups: int, missing: int | None
) -> None:
    """Six objects below a folder (one of 3 chunks and a bit), a header range and two unit
    ranges each, in 1 or 3 groups of every object: opened by the call, read bit-exact with
    each range's CRC on 1, 2 or 7 threads; an object removed ends the hits where a serial
    read would (its ranges' group ends the reads: the groups before it whole)."""
    rng = np.random.default_rng(groups * 10 + threads)
    blobs = [rng.integers(0, 256, 3 * CHUNK + 11 * o, np.uint8).tobytes() for o in range(6)]
    for o, blob in enumerate(blobs):
        (tmp_path / f"o{o}").write_bytes(blob)
    if missing is not None:
        (tmp_path / f"o{missing}").unlink()
    spans = [(0, 16), (16, CHUNK + 5), (CHUNK + 21, 2 * CHUNK - 21)]
    per_group = [spans[:1] + spans[1:2], spans[2:]] if groups == 3 else [spans]
    per_group = [*per_group, []] if groups == 3 else per_group  # an empty group too
    reads: list[Read] = []
    ends: list[int] = []
    for group in per_group:
        reads += [(o, off, n) for o in range(6) for off, n in group]
        ends.append(len(reads))
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sizes = [len(b) for b in blobs]
        (opened, done), into, crcs = call(
            (root, [f"o{o}" for o in range(6)]), sizes, reads, ends, threads
        )
    finally:
        os.close(root)
    # the objects before it in its first group are read, none after: as a serial read
    first_gone = next((k for k, (o, _, _) in enumerate(reads) if o == missing), len(reads))
    assert done == first_gone and opened == (6 if missing is None else missing)
    at = 0
    for k, (o, off, n) in enumerate(reads):
        if k < done:
            assert into[at : at + n].tobytes() == blobs[o][off : off + n]
            assert int(crcs[k]) == crc32c.crc32c(blobs[o][off : off + n])
        at += n


def test_only_a_regular_file_of_its_size_below_the_folder_is_opened(tmp_path: Path) -> None:
    """The jail, natively: a link (to a file inside or out), a FIFO (refused without
    blocking), a folder, a file of another size, a path out of the folder or through a link
    each read as absent; a used object's access time is set, its modification time kept. A
    lookup (`present`, `FileStore.exists`) finds the regular files of any size, as the
    store's Python open does."""
    store, outside = tmp_path / "store", tmp_path / "outside"
    store.mkdir()
    outside.write_bytes(b"x" * 64)
    (store / "good").write_bytes(b"g" * 64)
    os.utime(store / "good", ns=(1_000_000_000, 2_000_000_000))
    (store / "link").symlink_to(store / "good")
    (store / "out").symlink_to(outside)
    os.mkfifo(store / "fifo")
    (store / "folder").mkdir()
    (store / "short").write_bytes(b"s" * 63)
    (store / "via").symlink_to(store / "folder")
    (store / "folder" / "inner").write_bytes(b"i" * 64)
    names = [
        "good",
        "link",
        "out",
        "fifo",
        "folder",
        "short",
        "../outside",
        "via/inner",
        "/etc/passwd",
    ]
    root = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for k, name in enumerate(names):
            (opened, done), into, _ = call((root, [name]), [64], [(0, 0, 64)], [1], 1, used=True)
            assert (opened, done) == ((1, 1) if k == 0 else (0, 0)), name
            assert into[:64].tobytes() == (b"g" if k == 0 else b"\0") * 64
        # a lookup opens them alike (any size), and the store's own walk agrees
        found = [name in ("good", "short") for name in names]
        assert present((root, names), 3) == found
        store_ = FileStore(str(store))
        try:
            assert [store_._there(name) for name in names] == found
            assert store_.exists(names) == found
        finally:
            store_.close()
    finally:
        os.close(root)
    info = os.stat(store / "good")
    assert info.st_mtime_ns == 2_000_000_000 and info.st_atime_ns > 2_000_000_000


def test_each_group_is_handed_over_whole_in_order_and_may_stop_the_reads(tmp_path: Path) -> None:
    """on_group(g) once group g is whole, in order (its ranges' CRCs there); False stops the
    reads at that group; what on_group raises is raised once the threads are done. Given
    descriptors read as opened ones; columns that do not agree are refused before any read."""
    blob = np.random.default_rng(5).integers(0, 256, 4 * CHUNK, np.uint8).tobytes()
    (tmp_path / "a").write_bytes(blob)
    fd = os.open(tmp_path / "a", os.O_RDONLY)
    try:
        reads = [(0, g * CHUNK, CHUNK) for g in range(4)]
        seen: list[tuple[int, int]] = []

        def on_group(g: int) -> bool:
            seen.append((g, len(seen)))
            return g < 1

        fds = np.array([fd], np.int32)
        (opened, done), _, crcs = call(fds, [len(blob)], reads, [1, 2, 3, 4], 3, on_group=on_group)
        assert seen == [(0, 0), (1, 1)] and (opened, done) == (1, 2)
        assert [int(c) for c in crcs[:2]] == [
            crc32c.crc32c(blob[:CHUNK]),
            crc32c.crc32c(blob[CHUNK : 2 * CHUNK]),
        ]

        def raises(g: int) -> bool:
            raise KeyError(g)

        with pytest.raises(KeyError):
            call(fds, [len(blob)], reads, [2, 4], 4, on_group=raises)
        bad = [
            ([(0, 0, 4), (0, 4, 4)], [1, 1], "ends"),  # the last end is not the count
            ([(0, 0, 4), (0, 4, 4)], [2, 1], "ends"),
            ([(0, 0, 4), (0, 4, 4)], [], "no group"),
            ([(0, 0, 4), (1, 0, 4)], [2], "object 1 of 1"),
            ([(0, 0, 4), (0, -4, 4)], [2], "negative"),
        ]
        for reads_, ends, match in bad:
            with pytest.raises((ValueError, IndexError), match=match):
                call(fds, [len(blob)], reads_, ends, 2)
        two = np.array([fd, fd], np.int32)
        with pytest.raises(ValueError, match="ascending"):
            call(two, [len(blob)] * 2, [(1, 0, 4), (0, 0, 4)], [2], 2)
        with pytest.raises(ValueError, match="2 fds for 1 objects"):
            call(two, [len(blob)], [(0, 0, 4)], [1], 2)
        with pytest.raises(ValueError, match="threads"):
            call(fds, [len(blob)], [(0, 0, 4)], [1], 0)
    finally:
        os.close(fd)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
@pytest.mark.parametrize("stream_layers", [0, 1])
def test_a_load_of_pool_pages_reads_in_runs_only_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, stream_layers: int
) -> None:
    """Whole objects (a window per load) and streamed groups of layers alike: every read is
    in one native call for all the load's pages on the tier's 2 I/O threads (streamed: the
    first group, then every later one, each file opened once), none a page at a time."""
    overrides = [f"topology.mem_layout={layout}", "storage.io_threads=2"]
    with engine_with(tmp_path, *overrides, f"storage.stream_layers={stream_layers}") as engine:
        keys, expected = stored_prefix(engine)
        runs: list[tuple[int, int]] = []
        real_units = FileParts.read_units

        def read_units(reader: FileParts, reads: Any) -> int:
            runs.append((len(reads.names), reads.threads))
            return real_units(reader, reads)

        def read(*_: Any) -> bool:
            raise AssertionError("a page read on its own")

        monkeypatch.setattr(FileParts, "read_units", read_units)
        monkeypatch.setattr(FileStore, "read", read)
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        assert runs == [(PAGES, 2)]
        assert not first_mismatch(engine, target, expected)


@pytest.mark.usefixtures("one_rank")
def test_the_windows_of_a_fetch_are_the_groups_of_its_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows of 4 pages: one call whose groups are pages 0-3 and 4 (a header and the
    units each), handed over in order, a future a window (not a page); loaded bit-exact
    window by window."""
    overrides = ["topology.mem_layout=page_first_direct", "storage.io_threads=2"]
    with engine_with(tmp_path, *overrides, "storage.load_chunk_pages=4") as engine:
        keys, expected = stored_prefix(engine)
        calls: list[tuple[list[int], list[int]]] = []
        real_units = FileParts.read_units

        def read_units(reader: FileParts, reads: Any) -> int:
            groups: list[int] = []
            on_group = reads.on_group

            def seen(g: int) -> bool:
                groups.append(g)
                return bool(on_group(g))

            calls.append((reads.ends.tolist(), groups))
            return real_units(reader, dataclasses.replace(reads, on_group=seen))

        monkeypatch.setattr(FileParts, "read_units", read_units)
        runs: list[list[tuple[int, int]]] = []
        real_start = fetch.start_batches

        def start_batches(*args: Any) -> Any:
            started = real_start(*args)
            runs.append([(first, stop) for first, stop, _ in started.runs])
            return started

        monkeypatch.setattr(fetch, "start_batches", start_batches)
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        tier = engine.l3
        assert tier is not None
        per = len(tier.reads(False)) + 1
        assert calls == [([4 * per, PAGES * per], [0, 1])]
        assert runs == [[(0, 4), (4, PAGES)]]
        assert not first_mismatch(engine, target, expected)


def damage(path: Path, case: str, header: int) -> None:
    data = bytearray(path.read_bytes())
    if case == "truncated":
        del data[-1]
    else:
        data[1 if case == "header" else header + 3] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    ("case", "counted"), [("payload", "l3_corrupt"), ("header", "l3_corrupt"), ("truncated", None)]
)
def test_a_bad_object_in_a_run_ends_the_hits_at_its_page(
    tmp_path: Path, case: str, counted: str | None
) -> None:
    """Page 1's object damaged (a payload byte, a header byte) or cut short: the run's hits
    are page 0 alone, loaded bit-exact; damage counts as corrupt, a short object as a miss."""
    overrides = ["topology.mem_layout=page_first_direct", "storage.io_threads=1"]
    with engine_with(tmp_path, *overrides) as engine:
        keys, expected = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        name = tier.name(keys[1])
        damage(tmp_path / name, case, tier.object.header_size(tier.space, name, tier.checks))
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == 1 and loaded.handle is not None
        loaded.handle.done().wait()
        assert not first_mismatch(engine, target[:1], {u: t[:1] for u, t in expected.items()})
        counts = engine.trace.counts
        assert counts.get("l3_corrupt", 0) == int(counted == "l3_corrupt")
        assert counts.get("l3_miss", 0) == 1


@pytest.mark.usefixtures("one_rank")
def test_a_load_cut_short_returns_only_once_its_store_call_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page 1 damaged in a load of windows of 2 pages: the hits end at page 0, and the load
    returns only after the native call has returned (its reading threads may still be landing
    ranges of the next window when the miss is known), so nothing writes into the pages the
    load gives back. The call here lingers after its reads; the load waits for it."""
    overrides = ["topology.mem_layout=page_first_direct", "storage.load_chunk_pages=2"]
    with engine_with(tmp_path, *overrides, "storage.io_threads=2") as engine:
        keys, _ = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        name = tier.name(keys[1])
        damage(tmp_path / name, "payload", tier.object.header_size(tier.space, name, tier.checks))
        real_units, over = FileParts.read_units, threading.Event()

        def read_units(reader: FileParts, reads: Any) -> int:
            done = real_units(reader, reads)
            time.sleep(0.2)  # a call that ends well after its first window was resolved
            over.set()
            return done

        monkeypatch.setattr(FileParts, "read_units", read_units)
        loaded, _, _ = load(engine, keys)
        assert loaded.hits == 1
        assert over.is_set(), "the load returned while its store call still ran"


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("read_first", [False, True], ids=["as-they-come", "read-first"])
def test_a_later_group_that_misses_fails_a_streamed_load_at_its_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_first: bool
) -> None:
    """Read natively, layer by layer, with a byte of page 3's layer 2 flipped: its first
    group reads intact, so every page is a hit, and the same store call reads on; the waits
    raise by layer 2's (a wait also settles the later groups already read), naming the layer
    and the page, and the flip counts as corrupt. Where every later group was read before the
    load returned (`read-first`), neither the load nor `ready` raises: only the wait does."""
    layout = ["topology.mem_layout=page_first_direct", "storage.stream_layers=1"]
    layer = 2
    with engine_with(tmp_path, *layout, "storage.io_threads=2") as engine:
        keys, _ = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        real_fetch, path = tier.fetch, tmp_path / tier.name(keys[3])
        unit = next(u for u in tier.object.units if u.layer == layer)
        head = tier.object.header_size(tier.space, tier.name(keys[3]), tier.checks)
        damage(path, "payload", head + tier.object.offsets[unit.ordinal])

        def fetch(stages: Any, job: Any) -> Any:  # every later group read before the return
            done = real_fetch(stages, job)
            assert done.task is not None, "the fetch's call reads on"
            concurrent.futures.wait([done.task])
            return done

        if read_first:
            monkeypatch.setattr(tier, "fetch", fetch)
        loaded, _, _ = load(engine, keys)
        handle = loaded.handle
        assert loaded.hits == PAGES and handle is not None
        assert not handle.ready(layer)
        with pytest.raises(RuntimeError, match=rf"layers {layer}-{layer} not loaded.*page 3"):
            for waited in range(layer + 1):
                handle.wait(waited)
        assert engine.trace.counts.get("l3_corrupt", 0) == 1
        monkeypatch.undo()
        with contextlib.suppress(RuntimeError):
            while engine.acks.pending:
                engine.poll()


@pytest.mark.usefixtures("one_rank")
def test_a_native_read_lands_only_in_the_pools_own_pages(tmp_path: Path) -> None:
    """Its addresses are pool rows: the last page the pool holds is taken, the next refused
    before any byte moves (the allocator checks a caller's pages first; this is the floor)."""
    with engine_with(tmp_path, "topology.mem_layout=layer_first") as engine:
        tier = engine.l3
        assert tier is not None
        pages = tier.page_map(tier.reads(False), device=False)
        heads = np.array([64], np.int64)
        _, addresses, nbytes, *_ = unit_columns(pages, heads, np.array([pages.held - 1]), skip=0)
        for view, address, n in zip(
            pages.views(pages.held - 1), addresses[0], nbytes[0], strict=True
        ):
            assert np.frombuffer(view, np.uint8).ctypes.data == address and view.nbytes == n
        with pytest.raises(IndexError, match="not in a pool of"):
            unit_columns(pages, heads, np.array([pages.held]), skip=0)
        with pytest.raises(IndexError, match="not in a pool of"):
            unit_columns(pages, heads, np.array([-1]), skip=0)
