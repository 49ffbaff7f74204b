"""The L3 tier of one rank: what its stages see, and the write-back, lookup and fetch flows.

A write-back stores host pages as objects (`pipeline.core.l3`) on the tier's own thread, so
it never blocks the forward; a fetch reads objects into host pages (or, when the ranks' plans
differ, straight into device pages) on the caller's thread, after which an ordinary load moves
them to the device with the strategy's exchanges. The stage lists of both come from the
strategy (`strategy.l3`); their agreements run over the CPU group, per replica group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from pipeline.core.crc_runs import CrcRuns
from pipeline.core.l3 import (
    Checks,
    PageObject,
    PageRoles,
    check_keys,
    header,
    unit_digests,
)
from pipeline.core.l3_keys import key_list
from pipeline.core.model import Unit
from pipeline.core.ownership import OwnerMap
from pipeline.core.storage import StorageConfig
from pipeline.engine.cuda.streams import Event, WorkerStream
from pipeline.engine.l3.admission import Admission
from pipeline.engine.l3.jobs import ObjectsJob, window_pages
from pipeline.engine.l3.pages import (
    HEADER,
    PageMap,
    Placement,
    Runs,
    copy_runs,
    pool_runs,
    read_checked,
    span_checks,
    unit_checks,
)
from pipeline.engine.l3.scratch import Scratch, Scratches
from pipeline.engine.l3.stores import ObjectStore, reads_units
from pipeline.engine.l3.stores._fileio import crcs_of
from pipeline.engine.runtime import Runtime
from pipeline.engine.transfer.pools import DevicePool, HostPool
from pipeline.engine.transfer.state import Resources, Trace


@runtime_checkable
class ObjectStage(Protocol):
    """A stage of a write-back or a fetch: the `strategy.l3` lists."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None: ...


class L3Tier:
    """One rank's view of the L3 store: the object of a page, what this rank does with it,
    and the pools it fills."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        owns_store: bool,
        space: str,
        obj: PageObject,
        roles: PageRoles,
        runtime: Runtime,
        res: Resources,
        stream: WorkerStream,
        io: ThreadPoolExecutor,
        scratches: Scratches,
        owners: OwnerMap,
        storage: StorageConfig,
        checks: Checks,
    ) -> None:
        self.store, self.owns_store = store, owns_store  # False: the caller's store (it closes)
        self.space = space
        """The namespace of this model geometry's objects (`pipeline.core.l3.namespace`)."""
        self.object = obj
        self.roles = roles
        self.rank, self.global_rank = runtime.rank, runtime.global_rank
        self.group = runtime.replica_group
        """The replica group: the ranks that agree on plans and hits."""
        self.cpu_group = runtime.cpu_group
        """Gloo group of the engine's ranks (agreements gather over it and keep their group's)."""
        self.l3_group = runtime.l3_group
        """Gloo group of the engine's ranks for the write-back thread's sends."""
        self.host_pool: HostPool = res.host_pool
        self.device_pool: DevicePool = res.device_pool
        self.trace: Trace = res.trace
        self.stream = stream
        """The write-back thread."""
        self.io = io
        """The threads that read and write objects (`storage.io_threads`)."""
        self.scratches, self.owners, self.storage = scratches, owners, storage
        self.reading = reads_units(store)  # `l3.batch`, `l3.load`
        self.batch_pages = 2 * storage.io_threads
        """Pages a rotating owner sends the writer at once."""
        self.window_pages = window_pages(storage, runtime)
        """Pages of a fetch agreed on and loaded at a time (`storage.load_chunk_pages`)."""
        self.checks, self.digest = checks, checks.unit()
        self.digests = crcs_of if checks.key is None else self._each  # a write's, a page at once
        self.admission = Admission(storage)
        """Which pages a write-back stores (`storage.write_admission`)."""
        self.runs_crc = CrcRuns() if checks.key is None else None  # a MAC does not combine
        self._placements: dict[bool, Placement] = {}
        self._maps: dict[tuple[bool, tuple[int, ...]], PageMap] = {}
        self._known: dict[tuple[bool, int], tuple[tuple[Unit, ...], PageMap]] = {}

    def _each(self, parts: list[memoryview]) -> list[int]:
        """Each part's keyed digest (BLAKE2b, a call each)."""
        return [self.digest(v) for v in parts]

    def reads(self, fallback: bool) -> tuple[Unit, ...]:
        """The units this rank reads: its roles', or every unit (fallback)."""
        return self.object.units if fallback else self.roles.reads

    def agree(self, value: Any) -> list[Any]:
        """Every replica-group member's `value`, in group order (a collective of all ranks)."""
        return self.agree_while(value, False)[0]

    def agree_while(self, value: Any, going: bool) -> tuple[list[Any], bool]:
        """`agree`, and whether any rank at all is still `going` (a round of a loop that
        every rank runs as long as the longest)."""
        gathered = self.cpu_group.all_gather_object((self.group[0], value, going))
        return [v for first, v, _ in gathered if first == self.group[0]], any(
            g for _, _, g in gathered
        )

    def name(self, key: str) -> str:
        return self.object.name(self.space, key)

    def placement(self, *, device: bool) -> Placement:
        if device not in self._placements:
            pool = self.device_pool.buffers if device else self.host_pool.views
            self._placements[device] = Placement(self.object, pool)
        return self._placements[device]

    def runs(self, units: tuple[Unit, ...], page: int, *, device: bool) -> Runs:
        return pool_runs(self.device_pool if device else self.host_pool, units, page)

    def page_map(self, units: tuple[Unit, ...], *, device: bool) -> PageMap:
        """`units`' page map in the host (or device) pool, made once per set of units."""
        known = self._known.get((device, id(units)))  # the same tuple: the map, at once
        if known is not None and known[0] is units:
            return known[1]
        key = (device, tuple(u.ordinal for u in units))
        if key not in self._maps:
            self._maps[key] = PageMap(self.object, units, self.placement(device=device))
        self._known[(device, id(units))] = (units, self._maps[key])  # held: its id stays its
        return self._maps[key]

    def read(
        self, key: str, page: int, units: tuple[Unit, ...], *, device: bool, table: list[int]
    ) -> bool:
        """Read `units` of one page's object into a host page (or a device page), each unit
        checked as soon as it lands against the page's digest `table` (`read_checked`: read
        from the header into an empty one); False for a miss: absent, another length, a
        header or a unit digest that does not match (the pages may then hold some of the
        object's bytes, and must not be used)."""
        obj, name, pages = self.object, self.name(key), self.page_map(units, device=device)
        with self.scratches.taken() as scratch:
            head = memoryview(scratch.head)[: obj.header_size(self.space, name, self.checks)]
            spans = None if self.runs_crc is None else self._spans(pages, page, scratch)
            if spans is not None and self.runs_crc is not None:
                buffers, group_ok = span_checks(pages, spans, self.runs_crc)
            else:
                views = pages.views(page) if pages.direct else scratch.views(units)
                buffers, group_ok = unit_checks(pages, views, self.digest)
            header = functools.partial(unit_digests, head, obj, self.space, name, self.checks)
            ranges, check, failed = read_checked(head, pages, header, buffers, group_ok, table)
            if not self.store.read(name, head.nbytes + obj.page_bytes, ranges, check):
                there = functools.partial(self.store.exists, [name])
                if kind := failure(failed, keyed=self.checks.key is not None, there=there):
                    self.trace.op(kind)  # there, and did not check out
                return False
            if not pages.direct:
                targets = self.runs(units, page, device=device)
                copy_runs(scratch.like(targets), targets)
        return True

    @staticmethod
    def _spans(pages: PageMap, page: int, scratch: Scratch) -> list[memoryview] | None:
        """Each group of units as one buffer in the pool, or staged; None where the pool holds
        them apart."""
        return pages.spans(page) if pages.direct else scratch.spans(pages)

    def write(self, key: str, page: int, received: Mapping[int, memoryview]) -> None:
        """Store one page's object: this rank's units from its host page, the rest from
        `received` (rotating: the other owners' bytes, by unit ordinal)."""
        obj, name, own = self.object, self.name(key), self.roles.reads  # the units it holds
        assert len(own) + len(received) == len(obj.units), "the writer holds what it reads"
        pages = self.page_map(own, device=False)
        with self.scratches.taken() as scratch:
            if pages.direct:
                mine = pages.views(page)
            else:
                sources = self.runs(own, page, device=False)
                for staged, (pooled, _) in zip(scratch.like(sources), sources, strict=True):
                    staged.copy_(pooled)
                mine = scratch.views(own)
            views = dict(zip((u.ordinal for u in own), mine, strict=True)) | dict(received)
            parts = [views[u.ordinal] for u in obj.units]
            digests = self.digests(parts)
            head = header(self.space, name, digests, [v.nbytes for v in parts], self.checks)
            self.store.put(name, [head, *parts])

    def write_back(
        self, stages: tuple[ObjectStage, ...], job: ObjectsJob, after: Event | None
    ) -> Event:
        """Run the write-back stages on the tier's thread once `after` completes; the event
        completes when this rank's part is done (stored, or sent to the writer), with the
        error of a failed one (`job`: the pages `admitted` lets through)."""
        done = self.stream.new_event()

        def work() -> None:
            try:
                if after is not None:
                    after.wait()
                for stage in stages:
                    stage.on_objects(job, self)
            except BaseException as e:
                done.fail(e)
                raise
            done.set()

        self.stream.submit(work)
        return done

    def admitted(self, job: ObjectsJob) -> ObjectsJob:
        """The write-back `job` of the pages `admission` admits (the same on every rank of
        the group), each counted as admitted or declined."""
        keep = self.admission.admitted(job.keys)
        kept = int(keep.sum())
        self.trace.repeat("l3_admitted", kept)
        self.trace.repeat("l3_declined", len(keep) - kept)
        if keep.all():
            return job
        keys = [key for key, kept in zip(job.keys, keep, strict=True) if kept]
        return ObjectsJob(keys, job.host_pages[keep])

    def dropped(self, job: ObjectsJob) -> ObjectsJob:
        """No page of the write-back `job`: each counted as dropped (its bound was reached)."""
        self.trace.repeat("l3_dropped", len(job.keys))
        return ObjectsJob([], job.host_pages[:0])

    def lookup(self, keys: list[str]) -> int:
        """Pages at the front of `keys` whose objects this replica group can read: the MIN
        over the group of each reader's leading run of present objects. Each key counts as
        named once for write admission."""
        check_keys(keys := key_list(keys), len(keys))
        self.admission.named(keys)
        present = self.store.exists([self.name(k) for k in keys]) if self.roles.reads else []
        mine = present.index(False) if False in present else len(keys)
        return min(self.agree(mine))

    def fetch(self, stages: tuple[ObjectStage, ...], job: ObjectsJob) -> ObjectsJob:
        """Run the fetch stages on the caller's thread (they agree with the replica group)."""
        job.hits = len(job.keys)
        for stage in stages:
            stage.on_objects(job, self)
        return job

    def memory(self) -> list[memoryview]:
        """What reads land in: the pools where they land there directly (the host pool; a
        CPU device pool after a fallback) and the scratch buffers (a store may need it
        registered: Mooncake), so a read's `into` is where its bytes really land."""
        found = []
        for device in (False, True):
            place = self.placement(device=device)
            found += place.buffers if place.direct else []
        for scratch in self.scratches.all:
            found += [memoryview(scratch.head), scratch.bytes]
        return found

    def close(self) -> None:
        self.stream.close()
        self.io.shutdown()
        self.store.unregister(self.memory())
        if self.owns_store:
            self.store.close()


def failure(failed: list[int], *, keyed: bool, there: Callable[[], list[bool]]) -> str | None:
    """The op that counts a failed read other than a plain miss (`failed`: its ranges that
    failed their check; `there`: whether the object is in the store, asked only if needed).
    Under a key, an object there that the key does not authenticate (its header fails the
    keyed check, or it has another length: written without the key, with another one, or
    forged) is `l3_forged`; a payload that fails its digest (or, without a key, a header that
    fails its CRC) is `l3_corrupt`. Either is also a read miss, counted where the load stops."""
    if keyed and (failed == [HEADER] or (not failed and there() == [True])):
        return "l3_forged"
    return "l3_corrupt" if failed else None
