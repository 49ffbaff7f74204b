"""Mooncake Store: objects in the segments that the ranks lend a Mooncake master."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.core.storage import shown_url
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.mooncake_calls import BoundedCalls
from pipeline.engine.l3.stores.mooncake_parts import MooncakeParts
from pipeline.engine.l3.stores.mooncake_pieces import PAD, Pieces, lead
from pipeline.engine.l3.stores.mooncake_regions import Regions
from pipeline.engine.l3.stores.mooncake_units import MooncakeUnits
from pipeline.engine.l3.stores.mooncake_writes import MooncakeWrites
from pipeline.engine.l3.stores.parts import Check, Part, PartRead, Range, copy_out

NOT_FOUND = -704
"""Mooncake's error code for a name that holds nothing."""


class MooncakeStore:
    """A Mooncake Store client over TCP (RDMA where the machine has it), lending
    `segment_bytes` of this process's memory to the store. Puts pass through the client's own
    buffer of `buffer_bytes` (a put finding it full fails). A read whose buffers all lie in
    memory registered with `register` (the tier's host pool and headers) lands there with no
    copy (`batch_get_into_multi_buffers`: the object scattered into its header and unit rows,
    the bytes of units not asked for into a scratch region); any other read lands in one of
    `num_staging` registered buffers and is copied out. Every read, write, lookup and removal
    is bounded by `timeout_s` (see `mooncake_calls`): past it a read is a miss, a write or
    removal fails, and either says which master did not answer. The client's setup and close
    cannot be bounded: they hold Python's lock while they wait."""

    def __init__(
        self,
        master: str,
        metadata_server: str,
        segment_bytes: int,
        buffer_bytes: int,
        *,
        staging_bytes: int,
        num_staging: int,
        timeout_s: float,
    ) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore  # only where mooncake is used
        except ImportError as e:
            raise RuntimeError(
                "storage.kind=mooncake needs the mooncake-transfer-engine package and the "
                f"libibverbs1 system library (see README, L3 tier): {e}"
            ) from e
        self.client: Any = MooncakeDistributedStore()
        # setup holds Python's lock while it retries a silent master (minutes), so no thread
        # can time it out; a rank stalled in here is named by its missing heartbeat
        status = self.client.setup(
            "127.0.0.1", metadata_server, segment_bytes, buffer_bytes, "tcp", "", master
        )
        if status != 0:
            raise RuntimeError(
                f"cannot join the Mooncake master at {master} (metadata "
                f"{shown_url(metadata_server)}): "
                f"setup returned {status}"
            )
        self.staging_bytes = staging_bytes
        self._staging: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._registered: list[np.ndarray] = []
        for _ in range(num_staging):
            buf = np.empty(staging_bytes, dtype=np.uint8)
            if self.client.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
                raise RuntimeError(f"Mooncake refused to register a {staging_bytes} B buffer")
            self._registered.append(buf)
            self._staging.put(buf)
        self.regions = Regions(self.client, staging_bytes)
        self.pieces = Pieces()
        self.counters = Counters()
        # the I/O threads' reads, a lookup and a write-back's put can wait at once
        self.call = BoundedCalls(master, timeout_s, workers=num_staging + 2)

    def stats(self) -> dict[str, int | None]:
        """This process's counts; what the store holds is the master's to say (its own
        metrics port), so objects and bytes are None, as are evictions (the master's)."""
        return {**self.counters.snapshot(), "bytes": None, "objects": None}

    def cut(self, space: str, payload_bytes: int, cuts: Sequence[int]) -> None:
        """Keep `space`'s objects as pieces cut at `cuts` in their payloads
        (`mooncake_pieces`)."""
        self.pieces.cut(space, payload_bytes, cuts)

    def register(self, buffers: Sequence[memoryview]) -> None:
        """Let reads land in these buffers directly (they must outlive the registration)."""
        self.regions.register(buffers)

    def unregister(self, buffers: Sequence[memoryview]) -> None:
        self.regions.unregister(buffers)

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Whether each range (uint64 address, int64 length) lies in one registered region."""
        return self.regions.registered(addresses, nbytes)

    def part_of(self, size: int, ranges: Sequence[Range]) -> tuple[list[int], ...] | None:
        """`Regions.part_of`, a read that leaves out no more than a piece's PAD being whole."""
        return self.regions.part_of(size, ranges, PAD)

    def staging(self) -> np.ndarray:
        """One of the registered staging buffers (waits for one), until `unstaged`."""
        return self._staging.get()

    def unstaged(self, buffer: np.ndarray) -> None:
        self._staging.put(buffer)

    def put(self, name: str, parts: Sequence[Part]) -> None:
        kept = self.pieces.parts(name, parts)
        for piece, views in kept:
            self.upsert(piece, views)
        self.drop(self.pieces.stale(name, [piece for piece, _ in kept]))
        self.counters.add(writes=1, written_bytes=sum(v.nbytes for _, vs in kept for v in vs))

    def upsert(self, name: str, views: Sequence[memoryview]) -> None:
        """One Mooncake object (a piece, or a whole blob) from `views`, in order."""
        status = self.call(self.client.upsert_parts, name, *views)
        if status != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {status}")

    def read(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None = None
    ) -> bool:
        found = self.read_once(name, size, ranges, check)
        self.counters.add(**{"hits" if found else "misses": 1})
        return found

    def parts_reader(self) -> MooncakeParts:
        return MooncakeParts(self)

    def units_reader(self) -> MooncakeUnits:
        """A load's pages a group at a time, one client call each (`mooncake_units`)."""
        return MooncakeUnits(self)

    def units_writer(self) -> MooncakeWrites:
        """A write-back's new objects in one client call (`mooncake_writes`)."""
        return MooncakeWrites(self)

    def read_parts(self, reads: Sequence[PartRead]) -> int:
        """Every read in one ranged get where all land in registered memory (one call into
        the client for many objects, instead of one per object, each a turn of Python's
        lock); else one at a time."""
        kept, owners = self.pieces.expand(reads)
        parts = [self.part_of(size, ranges) for _, size, ranges, _ in kept]
        if any(part is None for part in parts):
            done = next((i for i, r in enumerate(kept) if not self.read_object(*r)), len(kept))
        else:
            done = self._read_parts(kept, [p for p in parts if p is not None])
        found = owners[done]
        self.counters.add(hits=found, misses=int(found < len(reads)))
        return found

    def _read_parts(self, reads: Sequence[PartRead], parts: list[tuple[list[int], ...]]) -> int:
        try:
            got = self.call(
                self.client.get_into_ranges,
                [ptr for ptrs, _, _ in parts for ptr in ptrs],
                [[r[0]] for r, (ptrs, _, _) in zip(reads, parts, strict=True) for _ in ptrs],
                [[[0]] for ptrs, _, _ in parts for _ in ptrs],
                [[[o]] for _, _, offsets in parts for o in offsets],
                [[[n]] for _, sizes, _ in parts for n in sizes],
            )
        except Exception:  # an unreachable master or peer: a miss
            return 0
        at = 0
        for i, ((_, _, ranges, check), (_, sizes, _)) in enumerate(zip(reads, parts, strict=True)):
            counts, at = [g[0][0] for g in got[at : at + len(sizes)]], at + len(sizes)
            if counts != sizes or not all(check(j) for j in range(len(ranges))):
                return i
        return len(reads)

    def read_once(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        return all(
            self.read_object(*read) for read in self.pieces.reads((name, size, ranges, check))
        )

    def read_object(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None
    ) -> bool:
        """`read_once` of one Mooncake object (a piece, or a whole blob)."""
        part = self.part_of(size, ranges)
        if part is not None:
            return self._read_part(name, part, ranges, check)
        scatter = self.regions.scatter(size, ranges)
        if scatter is None:
            return self._read_staged(name, size, ranges, check)
        try:
            (got,) = self.call(
                self.client.batch_get_into_multi_buffers, [name], [scatter[0]], [scatter[1]]
            )
        except Exception:  # an unreachable master or peer: a miss
            return False
        return got == size and (check is None or all(check(i) for i in range(len(ranges))))

    def _read_part(
        self, name: str, part: tuple[list[int], ...], ranges: Sequence[Range], check: Check | None
    ) -> bool:
        """Ranges of one object, each straight into its buffer, in one ranged get (no get
        session: a session is per key, and another thread may be reading the same object's
        other layers)."""
        ptrs, sizes, offsets = part
        try:
            got = self.call(
                self.client.get_into_ranges,
                ptrs,
                [[name]] * len(ptrs),
                [[[0]]] * len(ptrs),
                [[[o]] for o in offsets],
                [[[n]] for n in sizes],
            )
        except Exception:  # an unreachable master or peer: a miss
            return False
        if [g[0][0] for g in got] != sizes:  # a negative count: absent, or shorter
            return False
        return check is None or all(check(i) for i in range(len(ranges)))

    def _read_staged(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None
    ) -> bool:
        staging = self._staging.get()
        try:
            if size > staging.nbytes:
                return False
            if self.call(self.client.get_into, name, staging.ctypes.data, size) != size:
                return False
            return copy_out(staging, ranges, check)
        except Exception:  # an unreachable master or peer: a miss
            return False
        finally:
            self._staging.put(staging)

    def get(self, name: str) -> bytes | None:
        pieces = self.pieces.names(name)
        found = [self._get(piece) for piece in pieces]
        if all(blob is not None for blob in found):
            return b"".join(blob[lead(k) :] for k, blob in enumerate(found) if blob is not None)
        return self._get(name) if pieces != [name] else None  # a blob of another size

    def _get(self, name: str) -> bytes | None:
        try:
            return self.call(self.client.get, name) or None
        except Exception:  # an unreachable master or peer: a miss
            return None

    def exists(self, names: list[str]) -> list[bool]:
        forms = [self.pieces.forms(name) for name in names]
        there = iter(self.held([form for kept in forms for form in kept]))
        flags = [[next(there) for _ in kept] for kept in forms]
        return [f[0] or (len(f) > 1 and all(f[1:])) for f in flags]  # whole, or every piece

    def held(self, names: list[str]) -> list[bool]:
        """Whether each Mooncake object (a piece, or a whole blob) is there."""
        try:
            return [flag == 1 for flag in self.call(self.client.batch_is_exist, names)]
        except Exception:
            return [False] * len(names)

    def remove(self, names: list[str]) -> None:
        self.drop([form for name in names for form in self.pieces.forms(name)])

    def drop(self, names: list[str]) -> None:
        """Remove these Mooncake objects (pieces, or whole blobs), absent ones too, in one
        call: forced, as a read's lease would keep an object for a while."""
        if not names:
            return
        codes = self.call(self.client.batch_remove, names, True)
        failed = [(n, c) for n, c in zip(names, codes, strict=True) if c not in (0, NOT_FOUND)]
        if failed:
            raise RuntimeError("Mooncake remove of {} returned {}".format(*failed[0]))

    def close(self) -> None:
        for buf in self._registered:
            self.client.unregister_buffer(buf.ctypes.data)
        self.regions.close()
        self.call.close()
        self.client.close()  # holds Python's lock while it waits, as setup does
