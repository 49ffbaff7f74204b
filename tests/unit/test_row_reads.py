"""A native read into rows a pitch apart (`read_objects(..., rows, pitches)`): how the default
host layout, `page_first` (a token's layers side by side), takes a page straight from the
file store, each row in place, the range's CRC-32C summed as its rows land."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import numpy as np
import pytest

from pipeline.engine.l3.batch import batched
from pipeline.engine.l3.pages import unit_columns
from pipeline.engine.l3.stores._fileio import CHUNK, read_objects
from tests.unit.test_l3_stream import engine_with

HEAD = 13
"""Bytes of the object before the range (a header's place)."""


def read_rows(path: Path, length: int, row: int, pitch: int, into: np.ndarray) -> tuple:
    """Bytes [HEAD, HEAD + length) of the file at `path` into `into` as rows of `row` bytes
    `pitch` apart, in one read_objects call: (its answer, the range's CRC)."""
    fd = os.open(path, os.O_RDONLY)
    crcs = np.zeros(1, np.uint32)
    try:
        found = read_objects(
            np.array([fd], np.int32),
            np.array([path.stat().st_size], np.int64),
            False,
            np.zeros(1, np.int64),
            np.array([HEAD], np.int64),
            np.array([into.ctypes.data], np.uint64),
            np.array([length], np.int64),
            crcs,
            np.array([1], np.int64),
            1,
            None,
            np.array([row], np.int64),
            np.array([pitch], np.int64),
        )
    finally:
        os.close(fd)
    return found, int(crcs[0])


@pytest.mark.parametrize(
    ("row", "pitch", "length"),
    [
        (1152, 1152 * 61, 1152 * 64),  # deepseek_v3's page of one layer in page_first
        (7, 9, 7 * 1000),  # more rows than one vector takes (512)
        (1000, 3000, 2 * CHUNK + 2500),  # several chunks, the last row cut short
        (64, 64, 640),  # rows end to end: one run
    ],
)
def test_each_row_lands_in_place_and_the_range_keeps_one_crc(
    tmp_path: Path, row: int, pitch: int, length: int
) -> None:
    """Every row's bytes at its place, the gaps between rows untouched, and the CRC the one
    of the range's bytes as they lie in the object."""
    blob = np.random.default_rng(row).integers(0, 256, HEAD + length + 5, np.uint8).tobytes()
    (tmp_path / "o").write_bytes(blob)
    rows = -(-length // row)
    into = np.full((rows - 1) * pitch + row + 64, 0xA5, np.uint8)
    found, crc = read_rows(tmp_path / "o", length, row, pitch, into)
    assert found == (1, 1)
    expected = np.full_like(into, 0xA5)
    for r in range(rows):
        piece = blob[HEAD + r * row : HEAD + min((r + 1) * row, length)]
        expected[r * pitch : r * pitch + len(piece)] = np.frombuffer(piece, np.uint8)
    assert np.array_equal(into, expected)
    assert crc == crc32c.crc32c(blob[HEAD : HEAD + length])


def test_a_short_object_or_overlapping_rows_are_refused(tmp_path: Path) -> None:
    """An object shorter than the range is a miss; rows that would overlap (pitch below the
    row) or rows without pitches are refused before any byte moves."""
    (tmp_path / "o").write_bytes(bytes(HEAD + 100))
    into = np.zeros(4096, np.uint8)
    found, _ = read_rows(tmp_path / "o", 200, 10, 20, into)
    assert found == (1, 0)
    with pytest.raises(ValueError, match="overlap"):
        read_rows(tmp_path / "o", 100, 10, 9, into)
    with pytest.raises(ValueError, match="rows and pitches go together"):
        read_objects(
            np.array([-1], np.int32),
            *(np.zeros(1, np.int64),) * 1,
            False,
            *(np.zeros(1, np.int64),) * 2,
            np.zeros(1, np.uint64),
            np.zeros(1, np.int64),
            np.zeros(1, np.uint32),
            np.array([1], np.int64),
            1,
            None,
            np.zeros(1, np.int64),
        )


@pytest.mark.usefixtures("one_rank")
def test_the_default_layout_with_a_store_lands_whole_objects_in_one_run(tmp_path: Path) -> None:
    """tp1 with a store and no layout override: mem_layout auto takes page_first_direct, so
    a page's every unit lands as one run of the pool in the batched native call."""
    with engine_with(tmp_path) as engine:
        tier = engine.l3
        assert tier is not None and engine.topology.mem_layout.value == "page_first_direct"
        units = tier.reads(False)
        assert batched(tier, units, device=False) and tier.page_map(units, device=False).direct


@pytest.mark.usefixtures("one_rank")
def test_the_token_major_host_layout_reads_natively_and_only_into_its_own_pages(
    tmp_path: Path,
) -> None:
    """page_first (the preset's pool without a store, named here): a unit's page is rows a
    pitch apart, read in the batched native call; the last page the pool holds is taken (its
    last row ends inside the pool), the next refused before any byte moves."""
    with engine_with(tmp_path, "topology.mem_layout=page_first") as engine:
        tier = engine.l3
        assert tier is not None and engine.topology.mem_layout.value == "page_first"
        units = tier.reads(False)
        pages = tier.page_map(units, device=False)
        assert batched(tier, units, device=False) and pages.native and not pages.direct
        heads = np.array([64], np.int64)
        last = np.array([pages.held - 1])
        _, addresses, nbytes, rows, pitches = unit_columns(pages, heads, last, skip=0)
        pool = engine.host_pool.storage[0]
        end = pool.data_ptr() + pool.nbytes
        span = (nbytes[0] // rows[0] - 1) * pitches[0] + rows[0]
        assert (addresses[0] + span.astype(np.uint64) <= end).all()
        assert (rows[0] > 0).all() and (pitches[0] > rows[0]).all()
        with pytest.raises(IndexError, match="not in a pool of"):
            unit_columns(pages, heads, np.array([pages.held]), skip=0)


def test_ranges_end_to_end_in_the_file_are_read_together_each_summed_and_put_in_place(
    tmp_path: Path,
) -> None:
    """Several ranges of one object in one call, as a page's units are: those end to end in
    the file are read in one go (`read_run`) yet each lands at its own address (one run, or
    rows a pitch apart) with its own CRC; a small one (a header), a gap in the file, a range
    past CHUNK and a run past CHUNK split them, and a file cut short inside a run is a miss."""
    ranges = [  # offset, length, row (0: one run), pitch
        (0, 100, 0, 0),  # a header's size: read straight into place
        (100, 73728, 0, 0),
        (73828, 73728, 1152, 1152 * 3),
        (147556, 73728, 0, 0),
        (221384 + 7, 20000, 0, 0),  # after a gap of 7 bytes
        (241391, CHUNK + 5000, 1000, 1500),  # bigger than one read through the chunk
        *((1287391 + k * 300000, 300000, 0, 0) for k in range(5)),  # 1.5 MB: two reads
    ]
    size = ranges[-1][0] + ranges[-1][1]
    blob = np.random.default_rng(9).integers(0, 256, size, np.uint8).tobytes()
    (tmp_path / "o").write_bytes(blob)
    places = [(-(-n // row) - 1) * pitch + row if row else n for _, n, row, pitch in ranges]
    starts = np.cumsum([0, *(p + 64 for p in places)])
    into = np.full(int(starts[-1]), 0xA5, np.uint8)

    def read(path: Path) -> tuple[tuple[int, int], np.ndarray]:
        fd = os.open(path, os.O_RDONLY)
        crcs = np.zeros(len(ranges), np.uint32)
        try:
            found = read_objects(
                np.array([fd], np.int32),
                np.array([path.stat().st_size], np.int64),
                False,
                np.zeros(len(ranges), np.int64),
                np.array([o for o, *_ in ranges], np.int64),
                np.array([into.ctypes.data + int(s) for s in starts[:-1]], np.uint64),
                np.array([n for _, n, *_ in ranges], np.int64),
                crcs,
                np.array([len(ranges)], np.int64),
                2,
                None,
                np.array([row or n for _, n, row, _ in ranges], np.int64),
                np.array([pitch or n for _, n, _, pitch in ranges], np.int64),
            )
        finally:
            os.close(fd)
        return found, crcs

    found, crcs = read(tmp_path / "o")
    assert found == (1, len(ranges))  # the object opened, every range read
    expected = np.full_like(into, 0xA5)
    for (offset, n, row, pitch), at, crc in zip(ranges, starts, crcs, strict=False):
        row, pitch = row or n, pitch or n
        for r in range(-(-n // row)):
            piece = blob[offset + r * row : offset + min((r + 1) * row, n)]
            expected[at + r * pitch : at + r * pitch + len(piece)] = np.frombuffer(piece, np.uint8)
        assert crc == crc32c.crc32c(blob[offset : offset + n]), offset
    assert np.array_equal(into, expected)
    (tmp_path / "short").write_bytes(blob[: ranges[2][0] + 50])  # cut inside the first run
    assert read(tmp_path / "short")[0] == (1, 0)  # a short file: no range counts as read


def read_calls(path: Path, ranges: list[tuple[int, int]]) -> int:
    """The fewest read system calls this process made over five `read_objects` calls of
    `ranges` (offset, length) of the file into one buffer (/proc/self/io counts every thread's;
    the fewest leaves out a stray read of a thread of pytest's)."""
    into = np.zeros(sum(n for _, n in ranges), np.uint8)
    starts = np.cumsum([0, *(n for _, n in ranges)])[:-1]
    fd = os.open(path, os.O_RDONLY)
    counts = []
    try:
        for _ in range(5):
            before = Path("/proc/self/io").read_text()
            found = read_objects(
                np.array([fd], np.int32),
                np.array([path.stat().st_size], np.int64),
                False,
                np.zeros(len(ranges), np.int64),
                np.array([o for o, _ in ranges], np.int64),
                np.array([into.ctypes.data + int(s) for s in starts], np.uint64),
                np.array([n for _, n in ranges], np.int64),
                np.zeros(len(ranges), np.uint32),
                np.array([len(ranges)], np.int64),
                2,
                None,
            )
            after = Path("/proc/self/io").read_text()
            assert found == (1, len(ranges))
            counts.append(syscr(after) - syscr(before))
    finally:
        os.close(fd)
    return min(counts)


def syscr(io: str) -> int:
    return int(next(line for line in io.splitlines() if line.startswith("syscr:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_pages_units_end_to_end_take_one_read_and_a_gap_one_more(tmp_path: Path) -> None:
    """Eight units of 72 KiB end to end in the file take the read calls one range of all of
    them takes (`read_run`; a read a unit took eight), and a gap between them one more."""
    unit = 73728
    (tmp_path / "o").write_bytes(bytes(9 * unit))
    whole = read_calls(tmp_path / "o", [(0, 8 * unit)])
    assert read_calls(tmp_path / "o", [(k * unit, unit) for k in range(8)]) == whole
    split = [(k * unit, unit) for k in range(4)] + [((k + 1) * unit, unit) for k in range(4, 8)]
    assert read_calls(tmp_path / "o", split) == whole + 1
