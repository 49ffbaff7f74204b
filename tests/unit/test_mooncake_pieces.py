"""Objects kept in Mooncake as pieces cut where a streamed load's groups start
(`mooncake_pieces`): every read, write, lookup and removal maps a blob to its pieces, a load's
groups read whole pieces, and nothing cut elsewhere is ever read as the blob."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np
import pytest

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import MooncakeStore, UnitReads, open_store
from pipeline.engine.l3.stores.mooncake_pieces import PAD, Pieces
from pipeline.engine.l3.tier import L3Tier
from pipeline.jobs.bench.limits import mooncake_limits
from pipeline.jobs.l3_store import concrete
from tests.unit.test_l3_stream import engine_with, stored_prefix
from tests.unit.test_unit_reads import Spy

HEAD, UNIT, UNITS, OBJECTS = 64, 1024, 6, 5
SIZE = HEAD + UNITS * UNIT
PAYLOAD = UNITS * UNIT
CUTS = [UNIT, 4 * UNIT]
"""In the payload: three pieces, the header with unit 0, units 1-3, units 4-5 (a load's three
groups)."""
BOUNDS = [0, *(HEAD + c for c in CUTS), SIZE]
"""The pieces' bounds in an object of SIZE."""


def blob(k: int, size: int = SIZE) -> bytes:
    return np.random.default_rng(k).integers(0, 256, size, np.uint8).tobytes()


def test_a_read_maps_each_range_to_the_pieces_holding_it_checked_after_its_last_bytes() -> None:
    """Ranges inside a piece, across two cuts, and none in a piece: each piece read gets its
    share of the buffers at its own offsets, and a range's check runs with its last bytes."""
    pieces = Pieces()
    pieces.cut("ns", PAYLOAD, CUTS)
    data = blob(1)
    across = memoryview(bytearray(4 * UNIT))  # from inside unit 0 to inside unit 4
    inside = memoryview(bytearray(UNIT))  # unit 5
    checked: list[int] = []
    ranges = [(HEAD + UNIT // 2, [across]), (HEAD + 5 * UNIT, [inside])]
    reads = pieces.reads(("ns/ab/k", SIZE, ranges, lambda i: not checked.append(i)))
    names = pieces.names("ns/ab/k")
    assert len(names) == 3 and all(n.startswith("ns/ab/k@") for n in names)
    # every piece after the first starts with PAD bytes no one reads
    assert [(name, size) for name, size, _, _ in reads] == list(
        zip(names, [HEAD + UNIT, PAD + 3 * UNIT, PAD + 2 * UNIT], strict=True)
    )
    calls = []
    for k, (_, _, piece_ranges, check) in enumerate(reads):
        piece = bytes(PAD if k else 0) + data[BOUNDS[k] : BOUNDS[k + 1]]  # as the store keeps it
        for j, (offset, views) in enumerate(piece_ranges):
            for view in views:  # a store's read of the piece
                view[:] = piece[offset : offset + view.nbytes]
                offset += view.nbytes
            assert check(j)
            calls.append(list(checked))
    assert bytes(across) == data[HEAD + UNIT // 2 : HEAD + UNIT // 2 + 4 * UNIT]
    assert bytes(inside) == data[HEAD + 5 * UNIT :]
    assert calls == [[], [], [0], [0, 1]]  # range 0 checked once its last piece is in
    # a blob no longer than the payload is one object, as named; a longer header moves the
    # cuts with it
    assert [r[:2] for r in pieces.reads(("ns/ab/k", PAYLOAD, [], None))] == [("ns/ab/k", PAYLOAD)]
    assert pieces.of("ns/ab/k", SIZE + 8) == (0, *(b + 8 for b in BOUNDS[1:]))
    assert pieces.reads(("other/ab/k", SIZE, ranges, None))[0][0] == "other/ab/k"


def test_cuts_are_checked_and_one_per_space() -> None:
    pieces = Pieces()
    for bad in ([PAYLOAD], [-1], [PAYLOAD + 5]):
        with pytest.raises(ValueError, match="do not lie inside"):
            pieces.cut("ns", PAYLOAD, bad)
    pieces.cut("ns", PAYLOAD, CUTS)
    pieces.cut("ns", PAYLOAD, list(reversed(CUTS)))  # the same cuts: fine
    with pytest.raises(ValueError, match="are cut at"):
        pieces.cut("ns", PAYLOAD, CUTS[:1])
    pieces.cut("flat", PAYLOAD, [])  # no cuts: one object
    assert pieces.names("flat/ab/k") == ["flat/ab/k"] and pieces.forms("flat/ab/k") == ["flat/ab/k"]
    assert pieces.forms("ns/ab/k") == ["ns/ab/k", *pieces.names("ns/ab/k")]
    other = Pieces()
    other.cut("ns", PAYLOAD, [2 * UNIT])
    assert not set(other.names("ns/ab/k")) & set(pieces.names("ns/ab/k"))  # cut elsewhere


def test_a_blob_written_from_parts_goes_to_its_pieces_split_where_a_part_spans_a_cut() -> None:
    pieces = Pieces()
    pieces.cut("ns", PAYLOAD, CUTS)
    data = blob(2)
    parts = [data[:100], memoryview(data)[100:3000], memoryview(data)[3000:]]
    kept = pieces.parts("ns/ab/k", parts)
    assert [name for name, _ in kept] == pieces.names("ns/ab/k")
    for k, (_, views) in enumerate(kept):
        assert (
            b"".join(bytes(v) for v in views)
            == bytes(PAD if k else 0) + data[BOUNDS[k] : BOUNDS[k + 1]]
        )
    assert [name for name, _ in pieces.parts("ns/ab/k", [data[:PAYLOAD]])] == ["ns/ab/k"]


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[MooncakeStore, MooncakeStore]]:
    """Two clients of one master: one cutting `ns` at CUTS, one cutting it elsewhere."""
    with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=64 << 20)) as storage:
        cut, other = open_store(storage, SIZE), open_store(storage, SIZE)
        try:
            assert isinstance(cut, MooncakeStore) and isinstance(other, MooncakeStore)
            cut.cut("ns", PAYLOAD, CUTS)
            other.cut("ns", PAYLOAD, [2 * UNIT])
            yield cut, other
        finally:
            cut.close()
            other.close()


def held(store: MooncakeStore, name: str) -> list[bool]:
    """Whether the whole blob, then each of its pieces, is a Mooncake object."""
    return store.held(store.pieces.forms(name))


@pytest.mark.mooncake
def test_every_store_call_keeps_a_blob_as_its_pieces_and_replaces_every_other_form(
    stores: tuple[MooncakeStore, MooncakeStore],
) -> None:
    """A blob is its pieces and nothing else; a truncated one is cut where its own header ends
    (a read of the full size misses), one no longer than a payload replaces them whole; every
    form goes with a removal. A client that cuts the space elsewhere never finds the blob."""
    store, other = stores
    name, data = "ns/ab/forms", blob(3)
    store.put(name, [data[:10], data[10:]])
    assert held(store, name) == [False, True, True, True]
    assert store.get(name) == data and store.exists([name, "ns/ab/none"]) == [True, False]
    into = memoryview(bytearray(SIZE))
    assert store.read(name, SIZE, [(0, [into])]) and bytes(into) == data
    assert not other.read(name, SIZE, [(0, [memoryview(bytearray(SIZE))])])  # cut elsewhere
    assert other.get(name) is None and other.exists([name]) == [False]
    store.put(name, [data[:-1]])  # truncated: pieces of other lengths
    assert held(store, name) == [False, True, True, True] and store.get(name) == data[:-1]
    assert not store.read(name, SIZE, [(0, [into])])
    store.put(name, [data[:PAYLOAD]])  # no longer than a payload: the whole blob, no pieces
    assert held(store, name) == [True, False, False, False]
    assert store.exists([name]) == [True] and store.get(name) == data[:PAYLOAD]
    store.put(name, [data])
    assert held(store, name) == [False, True, True, True]
    store.remove([name])
    assert held(store, name) == [False, False, False, False]
    assert store.exists([name]) == [False] and store.get(name) is None


def unit_reads(pool: np.ndarray, heads: np.ndarray, groups: list[list[int]]) -> UnitReads:
    """Each object's header and units, a group of units at a time across every object (a
    streamed load: the header with group 0)."""
    objects, offsets, addresses, nbytes, ends = [], [], [], [], []
    for units in groups:
        for k in range(OBJECTS):
            if units[0] == 0:
                objects.append(k)
                offsets.append(0)
                addresses.append(heads.ctypes.data + k * HEAD)
                nbytes.append(HEAD)
            for u in units:
                objects.append(k)
                offsets.append(HEAD + u * UNIT)
                addresses.append(pool.ctypes.data + (k * UNITS + u) * UNIT)
                nbytes.append(UNIT)
        ends.append(len(objects))
    return UnitReads(
        [f"ns/ab/u{k}" for k in range(OBJECTS)],
        [SIZE] * OBJECTS,
        np.array(objects, np.int64),
        np.array(offsets, np.int64),
        np.array(addresses, np.uint64),
        np.array(nbytes, np.int64),
        np.zeros(len(objects), np.uint32),
        starts=True,
        ends=np.array(ends, np.int64),
        threads=2,
    )


@pytest.mark.mooncake
@pytest.mark.parametrize(
    "groups",
    [[[0], [1, 2, 3], [4, 5]], [[0, 1, 2, 3, 4, 5]], [[0], [1, 2], [3, 4, 5]]],
    ids=["at-the-cuts", "whole", "across-the-cuts"],
)
def test_a_load_reads_its_groups_as_whole_pieces_where_they_meet_the_cuts(
    stores: tuple[MooncakeStore, MooncakeStore], groups: list[list[int]]
) -> None:
    """Written in one `put_many`, read group by group: bit-exact with every range's CRC; a
    group that is whole pieces takes whole gets only (no ranged get, no session), one
    that ends inside a piece takes ranged gets of it."""
    store, _ = stores
    writer = store.units_writer()
    objects = [
        (f"ns/ab/u{k}", [blob(10 + k)[:HEAD], memoryview(blob(10 + k))[HEAD:]])
        for k in range(OBJECTS)
    ]
    writer.put_many([])  # nothing to write: no call
    writer.put_many(objects)
    assert all(held(store, name)[1:] == [True] * 3 for name, _ in objects)
    pool = np.zeros(OBJECTS * UNITS * UNIT, np.uint8)
    heads = np.zeros(OBJECTS * HEAD, np.uint8)
    store.register([pool.data])
    try:
        reader = store.units_reader()
        calls: Counter[str] = Counter()
        reader.client = Spy(reader.client, calls)  # type: ignore[assignment]
        reads = unit_reads(pool, heads, groups)
        assert reader.read_units(reads) == len(reads.objects)
        reader.close()
        for k in range(len(reads.objects)):
            o, at, n = int(reads.objects[k]), int(reads.offsets[k]), int(reads.nbytes[k])
            want = blob(10 + o)[at : at + n]
            assert ctypes.string_at(int(reads.addresses[k]), n) == want
            assert int(reads.crcs[k]) == crc32c.crc32c(want)
        ranged = calls["batch_get_into_multi_buffer_ranges"] + calls["get_into_ranges"]
        aligned = all(g[0] * UNIT in CUTS for g in groups[1:])
        assert calls["batch_get_into_multi_buffers"] == (len(groups) if aligned else 1)
        assert (ranged == 0) == aligned, calls
    finally:
        store.unregister([pool.data])
        store.remove([name for name, _ in objects])


class Gets:
    """A Mooncake client that notes the names of each `batch_get_into`."""

    def __init__(self, client: object) -> None:
        self.client, self.calls = client, list[list[str]]()

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def batch_get_into(self, names: list[str], *args: object) -> list[int]:
        self.calls.append(list(names))
        return self.client.batch_get_into(names, *args)  # type: ignore[attr-defined]


@pytest.mark.mooncake
@pytest.mark.usefixtures("one_rank")
def test_the_raw_loop_reads_the_pieces_as_stored_and_beside_them_one_object_a_page(
    tmp_path: Path,
) -> None:
    """`bench=l3`'s Mooncake limit: the client's own gets of the objects the store keeps (a
    tier cut by an explicit stream_layers: its pieces), then of the same bytes put as one
    object a page under names of the run's own, removed after."""
    with engine_with(tmp_path, "storage.stream_layers=2", store="mooncake") as engine:
        keys, _ = stored_prefix(engine)
        tier = engine.l3
        assert isinstance(tier, L3Tier) and isinstance(tier.store, MooncakeStore)
        gets = Gets(tier.store.client)
        tier.store.client = gets  # type: ignore[assignment]
        limits = mooncake_limits(tier, tier.store, keys, repeats=1, cuda=False)
        assert limits["raw_gbps"] > 0 and limits["raw_whole_gbps"] > 0
        pieces, whole = gets.calls  # one get of each side
        assert pieces == [p for k in keys for p in tier.store.pieces.names(tier.name(k))]
        assert len(pieces) > len(keys) and len(whole) == len(keys)
        assert all(w.startswith(f"{tier.name(k)}.raw-") for w, k in zip(whole, keys, strict=True))
        assert tier.store.held(whole) == [False] * len(keys)  # the run's own copies, gone
