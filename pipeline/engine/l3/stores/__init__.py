"""L3 object stores: a folder on local disk (`files`), and Mooncake Store (`mooncake`).

A store moves opaque blobs by name; what a blob means, and whether it is intact, is
`pipeline.core.l3`'s business. A read that fails for any reason is a miss (None, False), never
an error in the middle of a transfer; opening a store and writing to it can fail loudly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores.capacity import Quota
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.direct import DirectReads
from pipeline.engine.l3.stores.files import TIMEOUT_S, FileStore
from pipeline.engine.l3.stores.mooncake import MooncakeStore
from pipeline.engine.l3.stores.parts import Check, Part, PartRead, Range, SpanReads, UnitReads

__all__ = [
    "Check",
    "FileStore",
    "MooncakeStore",
    "ObjectStore",
    "Part",
    "PartRead",
    "PartsReader",
    "Range",
    "SpanReads",
    "UnitReads",
    "UnitsReader",
    "UnitsWriter",
    "open_store",
    "reads_units",
]


class PartsReader(Protocol):
    """Reads of parts of blobs (`ObjectStore.parts_reader`); it may hold what it read from
    (open files) until `close`."""

    def read_parts(self, reads: Sequence[PartRead]) -> int:
        """Each read as `ObjectStore.read` does it, in one call where the store can batch them;
        how many of them, from the first, found their blob and passed every check (it stops
        at the first that did not)."""

    def read_spans(self, spans: SpanReads) -> int:
        """`read_parts` of reads of one range into one buffer each, checked by its CRC."""

    def close(self) -> None: ...


class UnitsReader(PartsReader, Protocol):
    """A `PartsReader` that also reads a run of pages' ranges natively (`read_units`)."""

    rows: bool
    """Whether it lands a range as rows a pitch apart (`UnitReads.rows`)."""

    groups: bool
    """Whether it reads a group of layers (ranges inside objects) about as fast as whole
    objects, so a load may stream by default (`load.streamed_layers`)."""

    def read_units(self, reads: UnitReads) -> int:
        """Every range of `reads` into its memory, its CRC-32C into `reads.crcs`, in one call
        outside Python's lock (but for `reads.on_group`); how many ranges, from the first,
        were read whole (the reads stop at the group of a range of an object not there at
        its size, or of a short read)."""


class UnitsWriter(Protocol):
    """Writes of many objects in one native call (`put_many`)."""

    sums_units: bool
    """Whether `put_many` takes `tables`: it then sums (CRC-32C) each unit as it writes it,
    from the CPU's cache, where a sum before the write would read the pool once more."""

    def put_many(
        self,
        objects: Sequence[tuple[str, Sequence[Part]]],
        tables: Sequence[int] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        """`ObjectStore.put` of each (name, parts), all in one call on threads of the store's
        own, outside Python's lock; the first failure raised once every object was tried.
        With `tables` (`sums_units`): each object's first part is its header (writable)
        with its digests and check yet to fill, its digest table at tables[o]
        (`core.l3.table_at`); each unit's CRC-32C is put there as it is written, then the
        header's check, and the header is written last. Its other parts are a unit each, or
        with `units` (every object's unit lengths) runs of whole units end to end: a page's
        units one buffer, not a Python object a unit."""


class ObjectStore(Protocol):
    """Blobs by name. A blob is written from a list of buffers (a header and its units' pages)
    and read as byte ranges into buffers (a reader's units' rows in the pool): no joining
    copy, and a reader of some units reads only theirs."""

    counters: Counters
    """What this process counted, and who hears of its evictions."""

    def put(self, name: str, parts: Sequence[Part]) -> None:
        """Store the parts' bytes, in order, as one blob under `name` (replacing what was
        there)."""

    def read(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None = None
    ) -> bool:
        """Fill each range's buffers with the blob's bytes from its offset on, in order,
        calling `check` after each; False unless a blob of exactly `size` bytes is there and
        every check passed (what the buffers then hold is undefined)."""

    def read_once(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        """`read`, not counted as a hit or a miss (a write-back's check of what its name
        holds, `pipeline.engine.l3.intact`)."""

    def parts_reader(self) -> PartsReader:
        """A reader of parts of blobs, read several times each (a streamed load's later
        groups of layers, one run of pages), until its `close`."""

    def units_reader(self) -> UnitsReader | None:
        """A reader of `UnitReads` (a load's pages in one native call), or None where this
        store reads them only through `parts_reader` (O_DIRECT reads)."""

    def units_writer(self) -> UnitsWriter | None:
        """A writer of many objects in one native call, or None where this store writes
        them one `put` at a time (a bounded file store, which makes room for each)."""

    def get(self, name: str) -> bytes | None:
        """The blob under `name`, or None (absent, or unreadable)."""

    def exists(self, names: list[str]) -> list[bool]:
        """Whether each name holds a blob (of any length or content: only a read checks it)."""

    def remove(self, names: list[str]) -> None:
        """Drop these blobs (absent ones are fine)."""

    def cut(self, space: str, payload_bytes: int, cuts: Sequence[int]) -> None:
        """`space`'s objects may be kept in pieces from each of `cuts` on: offsets in the
        payload of `payload_bytes` that ends each object (`l3.groups.piece_cuts`: where a
        streamed load's groups start), for a store that gets whole objects faster than
        parts of them (Mooncake); the same for every writer and reader of the space.
        ValueError where the space is cut elsewhere already."""

    def register(self, buffers: Sequence[memoryview]) -> None:
        """Memory that reads may land in directly (a pool, headers), until `unregister`."""

    def unregister(self, buffers: Sequence[memoryview]) -> None: ...

    def stats(self) -> dict[str, int | None]:
        """What this process counted (`counters.COUNTED`), and the objects and bytes the
        store holds where it knows them (else None)."""

    def close(self) -> None:
        """Let go of the store's resources."""


def open_store(
    config: StorageConfig, largest_object: int = 1 << 20, *, timeout_s: float = TIMEOUT_S
) -> ObjectStore:
    """The store a config names (its master and folder already resolved by the job), for
    objects of at most `largest_object` bytes moved `storage.io_threads` at a time; a wait on
    a file store's lock or on a Mooncake master lasts at most `timeout_s` (runtime.timeout_s)."""
    if config.kind is StorageKind.file:
        assert config.path is not None, "the job gives a file store its folder"
        one_object = (largest_object, 1)
        problem = config.capacity_problem(*one_object) or config.quota_problem(*one_object)
        if problem is not None:
            raise ValueError(problem)
        direct = DirectReads(largest_object, config.io_threads) if config.direct_io else None
        return FileStore(
            config.path,
            direct,
            capacity_bytes=config.capacity,
            evict_to=config.evict_to,
            timeout_s=timeout_s,
            quota=tenant_quota(config),
            threads=config.io_threads,
        )
    assert config.kind is StorageKind.mooncake and config.metadata_server is not None
    in_flight = 2 * config.io_threads * largest_object  # puts stage through it
    return MooncakeStore(
        config.master,
        config.metadata_server,
        config.segment_bytes,
        max(in_flight, 16 << 20),
        staging_bytes=largest_object,
        num_staging=config.io_threads,
        timeout_s=timeout_s,
    )


def tenant_quota(config: StorageConfig) -> Quota | None:
    """The bound of this tenant's objects a config sets (None: no quota)."""
    quota = config.tenant_quota_bytes
    if not quota:
        return None
    return Quota(config.tenant, quota, int(config.evict_to * quota))


class UnitReading(NamedTuple):
    """What a store's `units_reader` does (`reads_units`): all False where it has none."""

    units: bool
    """It reads a load's pages in one call."""
    rows: bool
    """It lands a range as rows a pitch apart (`UnitsReader.rows`)."""
    groups: bool
    """It reads a group of layers about as fast as whole objects (`UnitsReader.groups`)."""


def reads_units(store: ObjectStore) -> UnitReading:
    """What `store`'s units reader does, asked once of a reader it closes at once."""
    reader = store.units_reader()
    if reader is None:
        return UnitReading(units=False, rows=False, groups=False)
    reader.close()
    return UnitReading(units=True, rows=reader.rows, groups=reader.groups)
