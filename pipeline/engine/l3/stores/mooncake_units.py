"""A load's pages read from Mooncake a group at a time (`UnitsReader.read_units`).

Each group of ranges (a window of pages, a streamed load's group of layers) is one client
call: objects read whole go through `batch_get_into_multi_buffers`, each scattered straight
into its ranges' memory; parts of objects through the get session's ranged get (each object's
replica looked up once, `MooncakeParts`). Ranges that follow each other in the object and in
memory go to the client as one. Then every range's CRC-32C is summed natively on the load's
threads (the client computes none; summed beside the client's next call instead, they cost
as much: BENCHMARKS.md, L3). Ranges outside the memory registered with the store (the
header rows a load reads into) land in a staging buffer and are copied out, so a group goes
in as many calls as its headers fill staging buffers (one, for any load's pages). Per page,
Python does nothing but build the columns. A ranged get cannot see an object's size: a part
of an object of another size is a miss by its CRC (the file store refuses it by its size).
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import numpy as np

from pipeline.engine.l3.stores._fileio import crcs_at
from pipeline.engine.l3.stores.mooncake_parts import MooncakeParts, RangedGets
from pipeline.engine.l3.stores.mooncake_pieces import PAD
from pipeline.engine.l3.stores.mooncake_regions import Regions
from pipeline.engine.l3.stores.parts import UnitReads

Part = tuple[list[int], list[int], list[int]]
"""An object's ranges for the client: (addresses, lengths, offsets in the object)."""


def whole(part: Part, size: int) -> bool:
    """Whether an object's ranges cover it from its first byte to its last, in order."""
    _, lengths, offsets = part
    ends = [o + n for o, n in zip(offsets, lengths, strict=True)]
    return offsets[0] == 0 and offsets[1:] == ends[:-1] and ends[-1] == size


def with_lead(part: Part, discard: int) -> Part:
    """`part` with the bytes before its first range, if no more than a piece's PAD, read into
    the `discard` region: so a piece is read whole."""
    ptrs, lengths, offsets = part
    if not 0 < offsets[0] <= PAD:
        return part
    return [discard, *ptrs], [offsets[0], *lengths], [0, *offsets]


class UnitGets(RangedGets, Protocol):
    """What a `MooncakeUnits` reads through (the Mooncake store)."""

    def registered(self, addresses: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Whether each range (uint64 address, int64 length) lies in registered memory."""

    staging_bytes: int
    """A staging buffer's size."""
    regions: Regions
    """The registered memory (its discard region takes the bytes no range asks for)."""

    def staging(self) -> np.ndarray:
        """A registered buffer of the largest object's size, until `unstaged`."""

    def unstaged(self, buffer: np.ndarray) -> None: ...


class MooncakeUnits(MooncakeParts):
    """A `MooncakeParts` that also reads a load's `UnitReads` (see the module). Ranges that
    land as rows a pitch apart are not taken (`rows`: the tier reads such pools a page at a
    time)."""

    rows = False
    groups = False
    """Not by default: a group's reads are ranged gets of one object a page (about half as
    fast as whole objects); objects kept as a piece a group (`mooncake_pieces`, what an
    explicit `storage.stream_layers` asks for) slowed loads and write-backs on the H100 host
    before their pad (docs/l3.md)."""

    def __init__(self, store: UnitGets) -> None:
        super().__init__(store)
        self.units = store

    def read_units(self, reads: UnitReads) -> int:
        if reads.rows is not None and bool(np.any(reads.rows)):
            raise ValueError("Mooncake reads ranges as one run each, not rows a pitch apart")
        reads, owners = self.store.pieces.units(reads)
        bounds, done, missed = [0, *reads.ends.tolist()], 0, False
        away = ~self.units.registered(reads.addresses, reads.nbytes)  # staged ranges
        for g in range(len(bounds) - 1):
            at = bounds[g]
            while at < bounds[g + 1]:  # a batch of the group's objects a staging buffer holds
                stop = self._batch_end(reads, away, at, bounds[g + 1])
                got = self._read(reads, away[at:stop], at, stop)
                at += got
                if at < stop:
                    break
            done, missed = at, at < bounds[g + 1]
            if missed or (reads.on_group is not None and not reads.on_group(g)):
                break
        hits = len(np.unique(owners[reads.objects[:done]]))  # a piece lands all or none
        self.store.counters.add(hits=hits, misses=int(missed))
        return done

    def _batch_end(self, reads: UnitReads, away: np.ndarray, at: int, stop: int) -> int:
        """Where the batch from range `at` (an object's first) ends: as many of the group's
        objects as one staging buffer holds the `away` (unregistered) ranges of (at least
        one)."""
        objects = reads.objects[at:stop]
        ends = np.append(np.flatnonzero(np.diff(objects)) + 1, stop - at)  # after each object
        staged = np.cumsum(np.where(away[at:stop], reads.nbytes[at:stop], 0))
        fits = ends[staged[ends - 1] <= self.units.staging_bytes]
        return at + int(fits[-1] if len(fits) else ends[0])

    def _read(self, reads: UnitReads, away: np.ndarray, at: int, stop: int) -> int:
        """Ranges [at, stop) (whole objects' ranges; `away`: those to stage) in one client
        call, then summed: how many, from the first, landed whole."""
        addresses, nbytes = reads.addresses[at:stop], reads.nbytes[at:stop]
        buffer = self.units.staging()
        try:
            staged = np.cumsum(np.where(away, nbytes, 0))
            if int(staged[-1]) > buffer.nbytes:
                return 0  # one object's headers outgrow a staging buffer: a miss
            into = addresses.copy()
            into[away] = np.uint64(buffer.ctypes.data) + (staged - nbytes)[away].astype(np.uint64)
            landed = self._land(reads, reads.objects[at:stop], reads.offsets[at:stop], into, nbytes)
            crcs_at(into[:landed], nbytes[:landed], reads.crcs[at : at + landed], reads.threads)
            for k in np.flatnonzero(away[:landed]).tolist():
                ctypes.memmove(int(addresses[k]), int(into[k]), int(nbytes[k]))
            return landed
        finally:
            self.units.unstaged(buffer)

    def _land(
        self,
        reads: UnitReads,
        objects: np.ndarray,
        offsets: np.ndarray,
        into: np.ndarray,
        nbytes: np.ndarray,
    ) -> int:
        """The ranges' bytes into `into`, one call for all their objects: how many ranges,
        from the first, landed whole (an object's ranges land all or none)."""
        firsts = np.flatnonzero(np.diff(objects, prepend=-1))
        names = [reads.names[o] for o in objects[firsts].tolist()]
        sizes = [int(reads.sizes[o]) for o in objects[firsts].tolist()]
        # a range that goes on where the last ended, in the object and in memory, joins it:
        # a run starts at every other
        starts = np.ones(len(objects), bool)
        starts[1:] = (
            (objects[1:] != objects[:-1])
            | (offsets[1:] != offsets[:-1] + nbytes[:-1])
            | (into[1:] != into[:-1] + nbytes[:-1].astype(np.uint64))
        )
        runs = np.flatnonzero(starts)
        lengths = np.add.reduceat(nbytes, runs)
        cuts = np.searchsorted(runs, firsts[1:])
        parts: list[Part] = [
            (p.tolist(), n.tolist(), o.tolist())
            for p, n, o in zip(
                np.split(into[runs], cuts),
                np.split(lengths, cuts),
                np.split(offsets[runs], cuts),
                strict=True,
            )
        ]
        discard = self.units.regions.discard.ctypes.data
        padded = [with_lead(part, discard) for part in parts]
        if all(whole(part, size) for part, size in zip(padded, sizes, strict=True)):
            parts, got = padded, self._whole(names, padded)
        else:
            got = self._ranged(names, parts)
        wanted = [sum(n) for _, n, _ in parts]
        bad = next((i for i, (g, w) in enumerate(zip(got, wanted, strict=True)) if g != w), None)
        return len(objects) if bad is None else int(firsts[bad])

    def _whole(self, names: list[str], parts: list[Part]) -> list[int]:
        """Whole objects, each scattered into its ranges: the bytes each landed."""
        try:
            ptrs, lengths = [p for p, _, _ in parts], [n for _, n, _ in parts]
            return list(self.call(self.client.batch_get_into_multi_buffers, names, ptrs, lengths))
        except Exception:  # an unreachable master or peer: a miss
            return [-1] * len(names)

    def _ranged(self, names: list[str], parts: list[Part]) -> list[int]:
        """Parts of objects through the session; those it could not read (another reader
        ended an object's session), in one call without it. The bytes each landed."""
        got = self._get(names, parts)
        again = [i for i, count in enumerate(got) if count < 0]
        if not again:
            return got
        flat = [(names[i], ptr, n, o) for i in again for ptr, n, o in zip(*parts[i], strict=True)]
        try:
            counts = self.call(
                self.client.get_into_ranges,
                [ptr for _, ptr, _, _ in flat],
                [[name] for name, _, _, _ in flat],
                [[[0]] for _ in flat],
                [[[o]] for _, _, _, o in flat],
                [[[n]] for _, _, n, _ in flat],
            )
        except Exception:  # an unreachable master or peer: a miss
            return got
        at = 0
        for i in again:
            lengths = parts[i][1]
            landed = [count[0][0] for count in counts[at : at + len(lengths)]]
            at += len(lengths)
            got[i] = sum(landed) if landed == lengths else -1
        return got
