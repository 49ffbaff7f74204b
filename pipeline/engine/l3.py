"""The L3 tier of one rank: what its stages see, and the write-back, lookup and fetch flows.

A write-back stores host pages as objects (`pipeline.spec.l3`) on the tier's own thread, so
it never blocks the forward; a fetch reads objects into host pages (or, when the ranks' plans
differ, straight into device pages) on the caller's thread, after which an ordinary load moves
them to the device with the strategy's exchanges. The stage lists of both come from the
strategy (`strategy.l3`); their agreements run over the CPU group, per replica group.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.distributed as dist

from pipeline.engine.pools import DevicePool, HostPool
from pipeline.engine.runtime import Runtime
from pipeline.engine.stores import ObjectStore, open_store
from pipeline.engine.streams import Event, WorkerStream
from pipeline.engine.transfer import Resources, Trace
from pipeline.spec.l3 import (
    ObjectSpec,
    check_keys,
    checksum,
    header,
    header_size,
    intact,
    largest_object,
    namespace,
    object_specs,
    share_of,
)
from pipeline.spec.model import ModelGeometry
from pipeline.spec.ownership import OwnerMap, Ownership
from pipeline.spec.plan import PlanSpec
from pipeline.spec.slots import PageAllocator, pages_of
from pipeline.spec.storage import StorageConfig
from pipeline.spec.topology import Topology


@dataclass
class ObjectsJob:
    """One write-back or fetch on this rank: page keys and the pages they go with."""

    keys: list[str]
    host_pages: np.ndarray
    """Local host page of each key."""
    device_pages: np.ndarray | None = None
    """A fetch: the device page of each key (written directly after a fallback)."""
    hits: int = 0
    """A fetch: the leading pages whose objects were read intact (on every rank once agreed)."""
    fallback: bool = False
    """A fetch: the ranks' plans differed, so each reads every object into its own device
    pages and no exchange runs."""

    def plan_digest(self) -> bytes:
        """SHA-256 of the logical plan: keys, host pages and device pages, in order."""
        sha = hashlib.sha256()
        sha.update("\n".join(self.keys).encode())
        sha.update(np.asarray(self.host_pages, dtype=np.int64).tobytes())
        if self.device_pages is not None:
            sha.update(np.asarray(self.device_pages, dtype=np.int64).tobytes())
        return sha.digest()


@runtime_checkable
class ObjectStage(Protocol):
    """A stage of a write-back or a fetch: the `strategy.l3` lists."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None: ...


@dataclass(frozen=True)
class L3Tier:
    """One rank's view of the L3 store: the objects of a page, and the pools they fill."""

    store: ObjectStore
    space: str
    """The namespace of this model geometry's objects (`pipeline.spec.l3.namespace`)."""
    objects: tuple[ObjectSpec, ...]
    """Every object of one page for this rank's replica group."""
    rank: int
    group: tuple[int, ...]
    """The replica group: the ranks that agree on plans and hits."""
    cpu_group: dist.ProcessGroup
    """Gloo group of every rank (agreements gather over it and keep their replica group's)."""
    host_pool: HostPool
    device_pool: DevicePool
    trace: Trace
    stream: WorkerStream
    """The write-back thread."""
    io: ThreadPoolExecutor
    """The threads that read and write objects (`storage.io_threads`)."""
    owns_store: bool = True
    """False for a store the caller opened (and closes)."""

    def writes(self) -> tuple[ObjectSpec, ...]:
        return tuple(o for o in self.objects if o.writer == self.rank)

    def reads(self, fallback: bool) -> tuple[ObjectSpec, ...]:
        """What this rank reads: the objects it is a reader of, or all of them (fallback)."""
        return (
            self.objects if fallback else tuple(o for o in self.objects if self.rank in o.readers)
        )

    def agree(self, value: Any) -> list[Any]:
        """Every replica-group member's `value`, in group order (a collective of all ranks)."""
        gathered: list[Any] = [None] * dist.get_world_size(self.cpu_group)
        dist.all_gather_object(gathered, (self.group[0], value), group=self.cpu_group)
        return [v for first, v in gathered if first == self.group[0]]

    def runs(self, spec: ObjectSpec, page: int, *, device: bool) -> list[torch.Tensor]:
        """A page of `spec`'s units, in unit order, as few tensors as the pool allows: each
        run of units of one pool kind that its buffer stacks is one. An object moves through
        a buffer of its own, one torch copy per run (parallel, outside Python's lock): on an
        H200 host that was twice as fast as reading straight into pinned pool pages."""
        pool = self.device_pool if device else self.host_pool
        found: list[torch.Tensor] = []
        for run in spec.unit_runs:
            stack = pool.stacked(run) if len(run) > 1 else None
            if stack is None:
                found.extend(pool.words[u.ordinal][page] for u in run)
            else:
                found.append(stack[:, page])
        return found

    def write(self, spec: ObjectSpec, key: str, host_page: int) -> None:
        """Store one object from a host page: its header, then its units' bytes."""
        name = spec.name(self.space, key)
        runs = self.runs(spec, host_page, device=False)
        parts = [torch.cat([r.reshape(-1).view(torch.uint8) for r in runs]).numpy().data]
        self.store.put(name, [header(self.space, name, spec.page_bytes, checksum(parts)), *parts])

    def read(self, spec: ObjectSpec, key: str, page: int, *, device: bool) -> bool:
        """Read one object into a host page (or a device page) of each of its units; False for
        a miss (the pages are then left as they were)."""
        name = spec.name(self.space, key)
        head, body = bytearray(header_size(self.space, name)), bytearray(spec.page_bytes)
        parts = [memoryview(head), memoryview(body)]
        if not self.store.get_into(name, parts) or not intact(head, self.space, name, parts[1:]):
            return False
        data, first = torch.frombuffer(body, dtype=torch.uint8), 0
        for run in self.runs(spec, page, device=device):
            run.copy_(data[first : first + run.nbytes].view(run.dtype).view(run.shape))
            first += run.nbytes
        return True

    def write_back(
        self, stages: tuple[ObjectStage, ...], job: ObjectsJob, after: Event | None
    ) -> Event:
        """Run the write-back stages on the tier's thread once `after` completes; the event
        completes when this rank's objects are stored (with the error of a failed one)."""
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

    def lookup(self, keys: list[str]) -> int:
        """Pages at the front of `keys` whose objects this replica group can read: the MIN
        over the group of each rank's leading run of present objects."""
        check_keys(keys, len(keys))
        reads = self.reads(fallback=False)
        names = [o.name(self.space, k) for k in keys for o in reads]
        present = np.array(self.store.exists(names) if names else [], dtype=bool)
        per_page = present.reshape(len(keys), len(reads)).all(axis=1) if reads else None
        mine = len(keys) if per_page is None or per_page.all() else int(np.argmin(per_page))
        return min(self.agree(mine))

    def fetch(self, stages: tuple[ObjectStage, ...], job: ObjectsJob) -> ObjectsJob:
        """Run the fetch stages on the caller's thread (they agree with the replica group)."""
        job.hits = len(job.keys)
        for stage in stages:
            stage.on_objects(job, self)
        return job

    def close(self) -> None:
        self.stream.close()
        self.io.shutdown()
        if self.owns_store:
            self.store.close()


def objects_job(
    keys: list[str],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor | None,
    spec: PlanSpec,
    host_allocator: PageAllocator,
) -> ObjectsJob:
    """A write-back's job (no device slots; its host pages must hold data) or a fetch's (its
    host pages must hold none: it would overwrite them); ValueError naming the argument
    otherwise, before any byte moves."""
    per_page = spec.slots_per_page
    host = pages_of("host_indices", host_indices, per_page, spec.host_slots).numpy()
    check_keys(keys, len(host))
    empty = host_allocator.without_data(host)
    if device_indices is None:
        if empty:
            raise ValueError(f"host_indices name pages that hold no data: {empty[:8]}")
        return ObjectsJob(keys, host)
    device = pages_of("device_indices", device_indices, per_page, spec.device_slots).numpy()
    if len(device) != len(host):
        raise ValueError(f"host_indices has {len(host)} pages but device_indices {len(device)}")
    if held := sorted(set(host.tolist()) - set(empty)):
        raise ValueError(f"host_indices name pages that hold data (a fetch overwrites): {held[:8]}")
    return ObjectsJob(keys, host, device)


def open_tier(
    storage: StorageConfig | None,
    runtime: Runtime,
    model: ModelGeometry,
    topology: Topology,
    ownership: Ownership,
    owners: OwnerMap,
    res: Resources,
    store: ObjectStore | None = None,
) -> L3Tier | None:
    """The rank's L3 tier, or None without a store: it joins the store (its folder or master
    resolved by the job), or uses `store`, opened by the caller for objects of up to
    `largest_object(model)` bytes."""
    if storage is None or not storage.attached:
        return None
    objects = object_specs(ownership, owners, model.units, share_of(topology, model, runtime.rank))
    return L3Tier(
        store=store or open_store(storage, largest_object(model)),
        owns_store=store is None,
        space=namespace(model),
        objects=objects,
        rank=runtime.rank,
        group=runtime.replica_group,
        cpu_group=runtime.cpu_group,
        host_pool=res.host_pool,
        device_pool=res.device_pool,
        trace=res.trace,
        stream=WorkerStream(f"l3-{runtime.rank}", runtime.timeout_s),
        io=ThreadPoolExecutor(storage.io_threads, thread_name_prefix=f"l3-io-{runtime.rank}"),
    )
