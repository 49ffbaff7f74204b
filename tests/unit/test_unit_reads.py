"""A store's `read_units`: a load's ranges of many objects in one call, group by group, each
range's CRC-32C taken as it lands; the same answers from the file store and Mooncake."""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import numpy as np
import pytest

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import FileStore, ObjectStore, UnitReads, open_store
from pipeline.engine.l3.stores.mooncake_units import MooncakeUnits
from pipeline.jobs.l3_store import concrete

HEAD, PAGE, UNITS, OBJECTS = 64, 4096, 4, 6
SIZE = HEAD + UNITS * PAGE
KINDS = [StorageKind.file, pytest.param(StorageKind.mooncake, marks=pytest.mark.mooncake)]


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: k.value)
def opened(request: pytest.FixtureRequest) -> Iterator[ObjectStore]:
    """A store of each kind for the module (a Mooncake master takes seconds to stop), its
    staging buffers the size of one object."""
    with concrete(StorageConfig(kind=request.param, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, SIZE)
        try:
            yield store
        finally:
            store.close()


@pytest.fixture
def store(opened: ObjectStore) -> ObjectStore:
    """The store holding OBJECTS objects of random bytes, `SIZE` each (a header, then UNITS
    pages of units), written afresh for each test."""
    for k in range(OBJECTS):
        opened.put(f"ns/ab/k{k}", [memoryview(blob(k))])
    return opened


def telling(told: list[int]) -> Callable[[int], bool]:
    """An `on_group` that notes each group it is told of and lets the reads go on."""

    def on_group(g: int) -> bool:
        told.append(g)
        return True

    return on_group


class Spy:
    """A Mooncake client whose calls are counted by name."""

    def __init__(self, client: Any, calls: Counter[str]) -> None:
        self.client, self.calls = client, calls

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        return getattr(self.client, name)


def spied(reader: Any) -> Counter[str] | None:
    """The calls a Mooncake reader makes from now on (None for the file store's)."""
    if not isinstance(reader, MooncakeUnits):
        return None
    calls: Counter[str] = Counter()
    reader.client = Spy(reader.client, calls)
    return calls


def blob(k: int) -> bytes:
    return np.random.default_rng(k).integers(0, 256, SIZE, np.uint8).tobytes()


class Load:
    """A load's memory: a pool (registered with the store unless `registered` is False) a
    run of UNITS pages per object, and header rows (never registered)."""

    def __init__(self, store: ObjectStore, *, registered: bool = True) -> None:
        self.store, self.registered = store, registered
        self.pool = np.zeros(OBJECTS * UNITS * PAGE, np.uint8)
        self.heads = np.zeros(OBJECTS * HEAD, np.uint8)
        if registered:
            store.register([self.pool.data])

    def close(self) -> None:
        if self.registered:
            self.store.unregister([self.pool.data])

    def reads(
        self, units: range, groups: list[int], *, names: dict[int, str] | None = None, **kw: object
    ) -> UnitReads:
        """Each object's header (where `units` starts at 0) and `units`, the objects split
        into groups ending at `groups`."""
        head = units.start == 0
        per = len(units) + int(head)
        objects = np.repeat(np.arange(OBJECTS), per)
        offsets, addresses, nbytes = [], [], []
        for k in range(OBJECTS):
            if head:
                offsets.append(0)
                addresses.append(self.heads.ctypes.data + k * HEAD)
                nbytes.append(HEAD)
            for u in units:
                offsets.append(HEAD + u * PAGE)
                addresses.append(self.pool.ctypes.data + (k * UNITS + u) * PAGE)
                nbytes.append(PAGE)
        return UnitReads(
            [(names or {}).get(k, f"ns/ab/k{k}") for k in range(OBJECTS)],
            kw.pop("sizes", [SIZE] * OBJECTS),  # type: ignore[arg-type]
            objects,
            np.array(offsets, np.int64),
            np.array(addresses, np.uint64),
            np.array(nbytes, np.int64),
            np.zeros(len(objects), np.uint32),
            starts=head,
            ends=np.array(groups, np.int64) * per,
            threads=2,
            **kw,  # type: ignore[arg-type]
        )

    def landed(self, reads: UnitReads, count: int) -> bool:
        """Whether the first `count` ranges hold their objects' bytes and CRCs."""
        for k in range(count):
            o, at, n = int(reads.objects[k]), int(reads.offsets[k]), int(reads.nbytes[k])
            want = blob(o)[at : at + n]
            got = ctypes.string_at(int(reads.addresses[k]), n)
            if got != want or int(reads.crcs[k]) != crc32c.crc32c(want):
                return False
        return True


@pytest.mark.parametrize("registered", [True, False], ids=["pool-registered", "all-staged"])
@pytest.mark.parametrize("units", [range(UNITS), range(1, 3)], ids=["whole", "parts"])
def test_every_group_lands_whole_with_its_crcs(
    store: ObjectStore, units: range, registered: bool
) -> None:
    """Whole objects (headers into unregistered rows) and parts of objects, in two groups,
    each announced once whole; a pool not registered with Mooncake is staged a batch of
    objects at a time."""
    load, told = Load(store, registered=registered), list[int]()
    try:
        reader = store.units_reader()
        assert reader is not None
        calls = spied(reader)
        reads = load.reads(units, [2, OBJECTS], on_group=telling(told))
        assert reader.read_units(reads) == len(reads.objects) and told == [0, 1]
        assert load.landed(reads, len(reads.objects))
        reader.close()
        if calls is not None:  # a call per group, or per staging buffer's worth of objects
            whole = units.start == 0
            get = "batch_get_into_multi_buffer" + ("s" if whole else "_ranges")
            staged = OBJECTS if whole else 1 + 2  # an object fills one; parts: 2 objects a call
            assert calls[get] == (2 if registered else staged), calls
    finally:
        load.close()


def test_the_reads_stop_at_the_group_of_a_missing_or_resized_object(store: ObjectStore) -> None:
    """An object not there, or read whole and shorter than its size, ends the reads: the ranges
    before it land, and no group after its own is announced; a false answer from `on_group`
    stops them."""
    load = Load(store)
    reader = store.units_reader()
    assert reader is not None
    try:
        told: list[int] = []
        missing = load.reads(
            range(UNITS),
            [2, 4, OBJECTS],
            names={3: "ns/ab/none"},
            on_group=telling(told),
        )
        per = UNITS + 1
        assert reader.read_units(missing) == 3 * per and told == [0]
        assert load.landed(missing, 3 * per)
        stopped = load.reads(range(UNITS), [2, OBJECTS], on_group=lambda g: False)
        assert reader.read_units(stopped) == 2 * per
        store.put("ns/ab/k1", [memoryview(blob(1)[:-1])])  # shorter than the read's size
        assert reader.read_units(load.reads(range(UNITS), [OBJECTS])) == per
    finally:
        reader.close()
        load.close()


def test_rows_a_pitch_apart_are_read_where_the_reader_says_so(store: ObjectStore) -> None:
    """The file store lands a range as rows a pitch apart (page_first pools); Mooncake's
    reader says it does not (`rows`), and refuses such reads before any byte moves."""
    load = Load(store)
    reader = store.units_reader()
    assert reader is not None
    try:
        rows = np.full(OBJECTS * 2, PAGE // 4, np.int64)
        pitches = np.full(OBJECTS * 2, PAGE // 2, np.int64)
        reads = load.reads(range(1, 3), [OBJECTS], rows=rows, pitches=pitches)
        if not reader.rows:
            with pytest.raises(ValueError, match="not rows a pitch apart"):
                reader.read_units(reads)
            assert not load.pool.any()
        else:
            assert isinstance(store, FileStore)
            assert reader.read_units(reads) == len(reads.objects)
    finally:
        reader.close()
        load.close()
