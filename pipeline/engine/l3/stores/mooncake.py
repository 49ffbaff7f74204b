"""Mooncake Store: objects in the segments that the ranks lend a Mooncake master."""

from __future__ import annotations

import bisect
import queue
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.core.storage import shown_url
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.mooncake_calls import BoundedCalls
from pipeline.engine.l3.stores.mooncake_parts import MooncakeParts
from pipeline.engine.l3.stores.mooncake_units import MooncakeUnits
from pipeline.engine.l3.stores.mooncake_writes import MooncakeWrites
from pipeline.engine.l3.stores.parts import Check, Part, PartRead, Range, bytes_views, copy_out

OBJECT_NOT_FOUND = -704
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
        self._discard = np.empty(staging_bytes, dtype=np.uint8)
        self._regions: list[tuple[int, int]] = []
        """Registered (start, end) addresses that reads land in directly, sorted."""
        self.register([self._discard.data])
        self.counters = Counters()
        # the I/O threads' reads, a lookup and a write-back's put can wait at once
        self.call = BoundedCalls(master, timeout_s, workers=num_staging + 2)

    def stats(self) -> dict[str, int | None]:
        """This process's counts; what the store holds is the master's to say (its own
        metrics port), so objects and bytes are None, as are evictions (the master's)."""
        return {**self.counters.snapshot(), "bytes": None, "objects": None}

    def register(self, buffers: Sequence[memoryview]) -> None:
        """Let reads land in these buffers directly (they must outlive the registration)."""
        for buf in buffers:
            start = np.frombuffer(buf, np.uint8).ctypes.data
            if self.client.register_buffer(start, buf.nbytes) != 0:
                raise RuntimeError(f"Mooncake refused to register a {buf.nbytes} B buffer")
            bisect.insort(self._regions, (start, start + buf.nbytes))

    def unregister(self, buffers: Sequence[memoryview]) -> None:
        for buf in buffers:
            start = np.frombuffer(buf, np.uint8).ctypes.data
            self.client.unregister_buffer(start)
            self._regions.remove((start, start + buf.nbytes))

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Whether each range (uint64 address, int64 length) lies in one registered region."""
        starts = np.array([a for a, _ in self._regions], np.uint64)
        ends = np.array([b for _, b in self._regions], np.uint64)
        i = np.searchsorted(starts, addresses, side="right") - 1
        inside = ends[np.maximum(i, 0)] >= addresses + nbytes.astype(np.uint64)
        return (i >= 0) & inside

    def staging(self) -> np.ndarray:
        """One of the registered staging buffers (waits for one), until `unstaged`."""
        return self._staging.get()

    def unstaged(self, buffer: np.ndarray) -> None:
        self._staging.put(buffer)

    def _address(self, view: memoryview) -> int | None:
        """The address of `view` if it lies in one registered region, else None."""
        start = np.frombuffer(view, np.uint8).ctypes.data
        i = bisect.bisect_right(self._regions, (start, 1 << 64)) - 1
        return start if i >= 0 and start + view.nbytes <= self._regions[i][1] else None

    def _scatter(self, size: int, ranges: Sequence[Range]) -> tuple[list[int], list[int]] | None:
        """(addresses, lengths) that cover the whole object in order: each range's buffers,
        the gaps between them into the discard region; None unless every buffer is
        registered."""
        ptrs: list[int] = []
        sizes: list[int] = []
        at, discard, most = 0, self._discard.ctypes.data, self._discard.nbytes
        for offset, buffers in [*ranges, (size, [])]:
            while at < offset:  # bytes no buffer asked for, up to this range (or the end)
                ptrs.append(discard)
                sizes.append(min(offset - at, most))
                at += sizes[-1]
            for view in buffers:
                start = self._address(view)
                if start is None:
                    return None
                ptrs.append(start)
                sizes.append(view.nbytes)
                at += view.nbytes
        return (ptrs, sizes) if at == size else None

    def put(self, name: str, parts: Sequence[Part]) -> None:
        views = bytes_views(parts)
        status = self.call(self.client.upsert_parts, name, *views)
        if status != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {status}")
        self.counters.add(writes=1, written_bytes=sum(v.nbytes for v in views))

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
        parts = [self.part_of(size, ranges) for _, size, ranges, _ in reads]
        if any(part is None for part in parts):
            found = next((i for i, r in enumerate(reads) if not self.read_once(*r)), len(reads))
        else:
            found = self._read_parts(reads, [p for p in parts if p is not None])
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
        part = self.part_of(size, ranges)
        if part is not None:
            return self._read_part(name, part, ranges, check)
        scatter = self._scatter(size, ranges)
        if scatter is None:
            return self._read_staged(name, size, ranges, check)
        try:
            (got,) = self.call(
                self.client.batch_get_into_multi_buffers, [name], [scatter[0]], [scatter[1]]
            )
        except Exception:  # an unreachable master or peer: a miss
            return False
        return got == size and (check is None or all(check(i) for i in range(len(ranges))))

    def part_of(self, size: int, ranges: Sequence[Range]) -> tuple[list[int], ...] | None:
        """(addresses, lengths, offsets in the object) of a read of part of an object (a
        streamed load's group of layers) into registered buffers; None for a whole object
        (one plain get moves it faster) or any buffer not registered."""
        ptrs: list[int] = []
        sizes: list[int] = []
        offsets: list[int] = []
        for offset, buffers in ranges:
            for view in buffers:
                start = self._address(view)
                if start is None:
                    return None
                ptrs.append(start)
                sizes.append(view.nbytes)
                offsets.append(offset)
                offset += view.nbytes
        return None if sum(sizes) >= size else (ptrs, sizes, offsets)

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
        try:
            blob = self.call(self.client.get, name)
        except Exception:  # an unreachable master or peer: a miss
            return None
        return blob or None

    def exists(self, names: list[str]) -> list[bool]:
        try:
            return [flag == 1 for flag in self.call(self.client.batch_is_exist, names)]
        except Exception:
            return [False] * len(names)

    def remove(self, names: list[str]) -> None:
        for name in names:  # forced: a read's lease would keep the object for a while
            status = self.call(self.client.remove, name, True)  # forced
            if status not in (0, OBJECT_NOT_FOUND):
                raise RuntimeError(f"Mooncake remove of {name} returned {status}")

    def close(self) -> None:
        for buf in self._registered:
            self.client.unregister_buffer(buf.ctypes.data)
        self.client.unregister_buffer(self._discard.ctypes.data)
        self.call.close()
        self.client.close()  # holds Python's lock while it waits, as setup does
