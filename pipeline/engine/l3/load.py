"""How a load from L3 reaches the forward: window by window as read, or streamed.

Windowed, the fetch reads whole objects and loads each window of `storage.load_chunk_pages`
pages once the group agreed on it; but an object holds every layer of its page, so no layer
is complete before the last object is read, and the forward waits for the whole prefix.
Streamed (`storage.stream_layers`; by default where it pays: `auto_layers`), the fetch reads
each page's first group (its first layer) and the replica group agrees on the hits from those
reads; where the store reads natively, the same call reads on to the later groups meanwhile,
kept where every page was a hit, else cancelled, waited for and started again for the hits.
The later groups are read in order, each group's copies issued once its reads are in, from
the forward's own calls (`wait`, `ready`, `done`). An object gone after the hits were agreed
(evicted, overwritten, corrupted) fails the load at its first layer: the layers before it
loaded, the host pages hold no data, the waits raise.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Protocol

import torch

from pipeline.core.model import ModelGeometry
from pipeline.core.plan import Direction
from pipeline.core.sizing import Sizing
from pipeline.core.slots import PageAllocator
from pipeline.core.steps import Step
from pipeline.engine.acks import AckLedger
from pipeline.engine.cuda.streams import Event, Stream
from pipeline.engine.l3.batch import batched
from pipeline.engine.l3.fetch import cancel_or_wait
from pipeline.engine.l3.groups import AUTO_GROUPS, auto_per_group, group_starts, layer_groups
from pipeline.engine.l3.handles import L3Load, WindowedLoad
from pipeline.engine.l3.jobs import ObjectsJob, Run
from pipeline.engine.l3.runs import settle_runs, start_runs
from pipeline.engine.l3.tier import L3Tier
from pipeline.engine.runtime import Runtime
from pipeline.engine.strategy import Strategy
from pipeline.engine.transfer import Pipeline
from pipeline.engine.transfer.executor import LoadHandle, finish, issue_copies, prepare
from pipeline.engine.transfer.graphs import TransferGraphs
from pipeline.engine.transfer.state import Transfer


def whole(run: Run) -> bool:
    """Whether a run of reads is done and read every page of it intact."""
    first, stop, future = run
    return future.done() and future.exception() is None and future.result() == stop - first


@dataclasses.dataclass
class GroupedLoad:
    """A planned load whose copies are issued a group of steps at a time; its ack is
    submitted with the last group (or its failure)."""

    transfer: Transfer
    pipeline: Pipeline
    stream: Stream
    acks: AckLedger
    host_allocator: PageAllocator
    forward: Stream
    timeout_s: float

    def __post_init__(self) -> None:
        prepare(self.pipeline, self.transfer, self.stream)
        self.handle = LoadHandle(self.transfer, self.pipeline, lazy=False, forward=self.forward)

    def issue(self, steps: list[Step], *, last: bool) -> None:
        t = self.transfer
        issue_copies(self.pipeline, t, self.stream, steps, last=last)
        if last:
            finish(self.pipeline, t, self.stream)
            self.acks.submit("load", t.done)

    def abandon(self, error: BaseException) -> None:
        """Fail the load: its waits raise `error`, its host pages hold no data."""
        t = self.transfer
        t.fail(error)
        self.host_allocator.hold_data(t.plan.host_pages, held=False)
        self.acks.submit("load", t.done)


class StreamedLoad:
    """The forward's view of a streamed load (the `Loading` protocol): a layer's wait first
    issues the copies of every group up to the one completing it, waiting for their reads,
    and of any later group whose reads are already in."""

    def __init__(
        self,
        tier: L3Tier,
        load: GroupedLoad,
        reads: list[tuple[ObjectsJob, list[Run]]],
        group_of: list[int],
        tasks: list[concurrent.futures.Future[None]],
    ) -> None:
        """`reads`: per group, its job and its runs of reads (group 0's settled by the fetch:
        none); `group_of`: each model layer's read group; `tasks`: the store calls reading the
        later groups (the fetch's own, where it reads on)."""
        self.tier, self.load, self.tasks, self.reads = tier, load, tasks, reads
        self.steps: list[list[Step]] = [[] for _ in reads]
        """Per read group, the steps it completes (a load group's step goes with the read
        group of its last layer)."""
        self.needs = list(group_of)
        """Per layer, the read group whose copies make it usable."""
        for step in load.transfer.plan.steps:
            g = group_of[step.layers[-1]]
            self.steps[g].append(step)
            for layer in step.layers:
                self.needs[layer] = max(self.needs[layer], g)
        self.issued = 0

    @property
    def num_layers(self) -> int:
        return self.load.handle.num_layers

    def wait(self, layer: int, consumer: Stream | None = None) -> None:
        if 0 <= layer < self.num_layers:
            self._issue_through(self.needs[layer])
        self.load.handle.wait(layer, consumer)

    def ready(self, layer: int) -> bool:
        self._issue_through(-1)
        return self.issued > self.needs[layer] and self.load.handle.ready(layer)

    def done(self, consumer: Stream | None = None) -> Event:
        self._issue_through(len(self.reads) - 1)
        return self.load.handle.done(consumer)

    def _issue_through(self, group: int) -> None:
        """Issue the groups up to `group`, and the later ones whose reads are all in, intact
        (a later group that missed fails the load only when it is waited for: neither the
        load's own return nor `ready` raises for a layer nobody asked for yet)."""
        while self.issued < len(self.reads) and self.load.transfer.error is None:
            k, (job, runs) = self.issued, self.reads[self.issued]
            if k > group and not all(whole(run) for run in runs):
                return
            self._settled(k, job, runs)
            self.issued += 1
            self.load.issue(self.steps[k], last=self.issued == len(self.reads))

    def _settled(self, k: int, job: ObjectsJob, runs: list[Run]) -> None:
        """Wait (at most runtime.timeout_s) for group `k`'s reads; fail the load on a miss."""
        timeout = self.load.timeout_s
        _, late = concurrent.futures.wait([run for _, _, run in runs], timeout=timeout)
        found = len(job.keys) if late else settle_runs(self.tier, job, runs)
        if not late and found == len(job.keys):
            return
        for _, later in self.reads[k:]:  # nothing writes into the pages after the failure
            cancel_or_wait([run for _, _, run in later])
        cancel_or_wait(self.tasks)  # a native call's last ranges land after their futures
        layers = sorted({u.layer for u in job.units})
        why = (
            f"its reads did not finish within runtime.timeout_s={timeout:g} s"
            if late
            else f"the object of page {found} (key {job.keys[found]}) went missing or failed "
            "its check after the hits were agreed"
        )
        error = RuntimeError(f"load_from_l3: layers {layers[0]}-{layers[-1]} not loaded: {why}")
        self.load.abandon(error)
        raise error


class Loader(Protocol):
    """What a streamed load needs of the engine."""

    strategy: Strategy
    runtime: Runtime
    model: ModelGeometry
    acks: AckLedger
    host_allocator: PageAllocator
    sizing: Sizing

    def verifies_next_load(self) -> bool: ...

    def load(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> LoadHandle: ...

    def transfer(
        self,
        direction: Direction,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        stream: Stream,
        graphs: TransferGraphs | None,
        breaks: frozenset[int] = ...,
    ) -> Transfer: ...


def windowed_from_l3(
    engine: Loader, tier: L3Tier, job: ObjectsJob, slots: tuple[torch.Tensor, torch.Tensor]
) -> L3Load:
    """Read whole objects; load each window of pages into `slots` (host, device) once the
    replica group agreed on it, while the next is read."""
    per_page, loads, (host, device) = engine.sizing.slots_per_page, [], slots

    def release(first: int, stop: int) -> None:
        engine.host_allocator.hold_data(job.host_pages[first:stop])
        window = slice(first * per_page, stop * per_page)
        loads.append(engine.load(host[window], device[window]))

    job.window_pages, job.release = tier.window_pages, release
    job = tier.fetch(engine.strategy.l3.fetch, job)
    return L3Load(job.hits, job.fallback, WindowedLoad(loads) if loads else None)


MIN_GROUP_BYTES = 16 << 20
"""The least a group of layers moves (this rank's bytes) for a null `stream_layers` to
stream: below it a group's own steps (its wait, its copies' issue) weigh on its read."""


def streamed_layers(engine: Loader, tier: L3Tier, pages: int) -> int:
    """Layers per group if the engine's load of `pages` from L3 streams, else 0: not where
    its strategy exchanges layers or the load verifies across ranks (their collectives would
    run inside the forward's waits), nor with storage.stream_layers=0; null: `auto_layers`
    (the same on every rank of the group: it depends on the config and the keys alone)."""
    if engine.strategy.load.exchange or engine.verifies_next_load():
        return 0
    if tier.storage.stream_layers is not None:
        return tier.storage.stream_layers
    units = tier.reads(False)
    gpu = engine.runtime.device.type == "cuda"
    native = gpu and tier.reading.groups and batched(tier, units, device=False)
    load_bytes = pages * sum(u.page_bytes for u in units)
    return auto_layers(engine.model.num_layers, load_bytes, gpu=gpu, native=native)


def auto_layers(num_layers: int, load_bytes: int, *, gpu: bool, native: bool) -> int:
    """A null `storage.stream_layers`: an eighth of the layers a group onto a GPU where the
    groups read natively at whole objects' speed and each moves at least MIN_GROUP_BYTES of
    `load_bytes`, else 0."""
    if not (gpu and native) or load_bytes < AUTO_GROUPS * MIN_GROUP_BYTES:
        return 0
    return auto_per_group(num_layers)


def stream_from_l3(
    engine: Loader,
    tier: L3Tier,
    job: ObjectsJob,
    per_group: int,
    slots: tuple[torch.Tensor, torch.Tensor],
) -> L3Load:
    """Read every page's first group of layers and agree on the hits (the strategy's fetch
    stages), plan the load of the hit pages into `slots` (host, device), start the later
    groups' reads, issue the first group's copies and hand the forward the rest."""
    starts = group_starts(engine.model.num_layers, per_group)
    groups = layer_groups(tier.reads(False), starts)
    job.units, job.tables = groups[0], [[] for _ in job.keys]
    job.later = [units for units in groups[1:] if units]  # read on in the same call, natively
    job = tier.fetch(engine.strategy.l3.fetch, job)
    if job.fallback or not job.hits:
        return L3Load(job.hits, job.fallback, None)
    hits, (host, device) = job.hits, slots
    engine.host_allocator.hold_data(job.host_pages[:hits])
    hit_slots, stream = slice(0, hits * engine.sizing.slots_per_page), engine.runtime.load_stream
    breaks = frozenset(starts)  # no step of the load waits for two groups
    t = engine.transfer(Direction.load, host[hit_slots], device[hit_slots], stream, None, breaks)
    run = engine.runtime
    parts = (engine.strategy.load, stream, engine.acks, engine.host_allocator)
    load = GroupedLoad(t, *parts, run.forward_stream, run.timeout_s)
    later = [
        dataclasses.replace(
            job,
            keys=job.keys[:hits],
            host_pages=job.host_pages[:hits],
            reads=[],
            units=units,
            tables=job.tables[:hits],
        )
        for units in groups[1:]
    ]
    if job.later_reads and job.task is not None:  # every page a hit: the fetch's call reads on
        started: list[list[Run]] = [[(0, hits, future)] for future in job.later_reads]
        tasks = [job.task]
    else:
        started, tasks = start_runs(tier, [j for j in later if j.units])
    runs = iter(started)
    reads: list[tuple[ObjectsJob, list[Run]]] = [(job, [])]
    reads += [(j, next(runs) if j.units else []) for j in later]
    read_group = {unit.layer: g for g, units in enumerate(groups) for unit in units}
    group_of = [read_group.get(layer, 0) for layer in range(engine.model.num_layers)]
    streamed = StreamedLoad(tier, load, reads, group_of, tasks)
    streamed._issue_through(0)
    return L3Load(hits, False, streamed)
