"""A run of pages read in one native call (`pipeline.engine.l3.batch`, `stores/_fileio.c`): the
CRC-32C is the `crc32c` package's, every range lands whole with its CRC or the call stops there,
a load of pages the host pool holds as bytes reads only through it (a run per I/O thread, no
read a page), bit-exact, and a bad object ends the hits at its page, counted as what it is."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

from pipeline.core.l3 import Checks, PageObject, header, unit_digests
from pipeline.core.l3_rows import header_rows
from pipeline.engine.l3.batch import unit_columns
from pipeline.engine.l3.stores import FileStore
from pipeline.engine.l3.stores._fileio import CHUNK, SUM, SUMS, crcs_of, read_into
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


def columns(fds: list[int], ranges: list[tuple[int, int]], into: np.ndarray) -> tuple[Any, ...]:
    """read_into's columns: range i of file fds[i] at (offset, size), end to end in `into`."""
    sizes = np.array([n for _, n in ranges], np.int64)
    at = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    return (
        np.array(fds, np.int32),
        np.array([o for o, _ in ranges], np.int64),
        into.ctypes.data + at,
        sizes,
        np.zeros(len(ranges), np.uint32),
    )


def test_read_into_lands_each_range_with_its_crc_and_stops_at_the_first_short_one(
    tmp_path: Path,
) -> None:
    """Ranges of two files, one over several chunks, land bit-exact with their CRCs; a range
    past the end of its file, or of a descriptor not open, ends the call there; columns that
    do not match are refused before any read."""
    blobs = [np.random.default_rng(k).integers(0, 256, 3 * CHUNK, dtype=np.uint8) for k in (1, 2)]
    fds = []
    for k, blob in enumerate(blobs):
        (tmp_path / f"f{k}").write_bytes(blob.tobytes())
        fds.append(os.open(tmp_path / f"f{k}", os.O_RDONLY))
    try:
        ranges = [(5, 100), (CHUNK - 7, 2 * CHUNK + 1), (0, 0), (3 * CHUNK - 1, 1)]
        owner = [0, 1, 0, 1]
        into = np.zeros(sum(n for _, n in ranges), np.uint8)
        cols = columns([fds[k] for k in owner], ranges, into)
        assert read_into(*cols) == len(ranges)
        at = 0
        for (offset, n), k, crc in zip(ranges, owner, cols[4], strict=True):
            want = blobs[k][offset : offset + n]
            assert np.array_equal(into[at : at + n], want)
            assert int(crc) == crc32c.crc32c(want.tobytes())
            at += n
        past = [(0, 10), (3 * CHUNK - 4, 5), (0, 10)]  # the second runs past the end
        assert read_into(*columns(fds[:1] * 3, past, np.zeros(25, np.uint8))) == 1
        closed = os.open(tmp_path / "f0", os.O_RDONLY)
        os.close(closed)
        assert read_into(*columns([fds[0], closed], [(0, 4), (0, 4)], np.zeros(8, np.uint8))) == 1
        good = columns(fds[:1], [(0, 4)], np.zeros(4, np.uint8))
        with pytest.raises(ValueError, match="offsets has 2 items, fds 1"):
            read_into(good[0], np.zeros(2, np.int64), *good[2:])
        with pytest.raises(ValueError, match="crcs: 6 bytes"):
            read_into(*good[:4], np.zeros(6, np.uint8))
        with pytest.raises(BufferError):
            read_into(*good[:4], b"\0\0\0\0")  # not writable
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
@pytest.mark.parametrize("stream_layers", [0, 1])
def test_a_load_of_pool_pages_reads_in_runs_only_bit_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, stream_layers: int
) -> None:
    """Whole objects (a window per load) and streamed groups of layers alike: every read is
    a run of pages in one native call, a run per I/O thread, none a page at a time."""
    overrides = [f"topology.mem_layout={layout}", "storage.io_threads=2"]
    with engine_with(tmp_path, *overrides, f"storage.stream_layers={stream_layers}") as engine:
        keys, expected = stored_prefix(engine)
        runs: list[int] = []
        real_units = FileParts.read_units

        def read_units(reader: FileParts, reads: Any) -> int:
            runs.append(len(reads.names))
            return real_units(reader, reads)

        def read(*_: Any) -> bool:
            raise AssertionError("a page read on its own")

        monkeypatch.setattr(FileParts, "read_units", read_units)
        monkeypatch.setattr(FileStore, "read", read)
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        calls = 2 if stream_layers else 1  # the first group; then every later one, in one call
        assert sorted(runs) == sorted([3, 2] * calls)  # pages 0-2, 3-4: a run per thread
        assert not first_mismatch(engine, target, expected)


@pytest.mark.usefixtures("one_rank")
def test_each_window_of_a_fetch_is_split_across_the_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows of 4 pages on 2 I/O threads: runs of 2 pages, started in page order, so the
    first window's reads come first; loaded bit-exact window by window."""
    overrides = ["topology.mem_layout=page_first_direct", "storage.io_threads=2"]
    with engine_with(tmp_path, *overrides, "storage.load_chunk_pages=4") as engine:
        keys, expected = stored_prefix(engine)
        firsts: list[str] = []
        real_units = FileParts.read_units

        def read_units(reader: FileParts, reads: Any) -> int:
            firsts.append(reads.names[0])
            return real_units(reader, reads)

        monkeypatch.setattr(FileParts, "read_units", read_units)
        loaded, target, _ = load(engine, keys)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        tier = engine.l3
        assert tier is not None
        assert sorted(firsts) == sorted(tier.name(keys[i]) for i in (0, 2, 4))
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
@pytest.mark.parametrize(("case", "layer"), [("gone", 1), ("damaged", 2)])
def test_a_later_group_that_misses_fails_a_streamed_load_at_its_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, layer: int
) -> None:
    """Read natively, layer by layer: page 3's object removed (its first later group, layer
    1, misses it), or a byte of its layer 2 flipped, once the hits are agreed: the waits raise
    by that layer's (a wait also settles the later groups already read), naming the layer and
    the page; a flipped byte counts as corrupt."""
    layout = ["topology.mem_layout=page_first_direct", "storage.stream_layers=1"]
    with engine_with(tmp_path, *layout, "storage.io_threads=2") as engine:
        keys, _ = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        real_fetch, path = tier.fetch, tmp_path / tier.name(keys[3])
        unit = next(u for u in tier.object.units if u.layer == 2)
        head = tier.object.header_size(tier.space, tier.name(keys[3]), tier.checks)

        def fetch(stages: Any, job: Any) -> Any:
            done = real_fetch(stages, job)
            if case == "gone":
                path.unlink()
            else:
                damage(path, "payload", head + tier.object.offsets[unit.ordinal])
            return done

        monkeypatch.setattr(tier, "fetch", fetch)
        loaded, _, _ = load(engine, keys)
        handle = loaded.handle
        assert loaded.hits == PAGES and handle is not None
        with pytest.raises(RuntimeError, match=rf"layers {layer}-{layer} not loaded.*page 3"):
            for waited in range(layer + 1):
                handle.wait(waited)
        assert engine.trace.counts.get("l3_corrupt", 0) == int(case == "damaged")
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
        _, addresses, nbytes = unit_columns(pages, heads, np.array([pages.held - 1]), skip=0)
        for view, address, n in zip(
            pages.views(pages.held - 1), addresses[0], nbytes[0], strict=True
        ):
            assert np.frombuffer(view, np.uint8).ctypes.data == address and view.nbytes == n
        with pytest.raises(IndexError, match="not in a pool of"):
            unit_columns(pages, heads, np.array([pages.held]), skip=0)
        with pytest.raises(IndexError, match="not in a pool of"):
            unit_columns(pages, heads, np.array([-1]), skip=0)
