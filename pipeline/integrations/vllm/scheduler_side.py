"""The connector in vLLM's scheduler process: which blocks a request can load (the host
tier's directory, then the store's lookup), and each step's moves for the workers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request

import pipeline
from pipeline.config.job import Job
from pipeline.core.sizing import size_rank
from pipeline.engine.l3.store_view import StoreView
from pipeline.integrations.vllm.directory import BlockHash, HostDirectory, Placed
from pipeline.integrations.vllm.events import TierEvents
from pipeline.integrations.vllm.metadata import Moves, StepMeta


def host_pages(job: Job, device_tokens: int) -> int:
    """The host pages every worker's engine has over vLLM's `device_tokens` (as each sizes
    them when it adopts vLLM's KV tensors; a rank that holds fewer layers may hold more)."""
    budget = dataclasses.replace(job.budget(), device_tokens=device_tokens)
    model, topology, config = job.model, job.topology, job.strategy.config
    ranks = range(topology.tp_size)
    return min(size_rank(model, topology, config, rank, budget).host.num_pages for rank in ranks)


@dataclass
class Match:
    """A request's blocks the connector can load, from block `start` on."""

    start: int
    host: list[BlockHash]
    store: list[BlockHash]


@dataclass
class Loading:
    """A request's blocks to load, from block `start` on: the host tier's, then the
    store's, with the host pages each goes through."""

    start: int
    host: list[BlockHash]
    host_pages: list[int]
    store: list[BlockHash]
    placed: Placed = field(default_factory=lambda: Placed([], [], []))
    """The store's blocks' pages, and those placing them evicted (freed first)."""
    missing: bool = False
    """No room for the store's blocks: the workers report them as load errors."""


@dataclass
class Tracked:
    """A request the connector moves blocks of: its vLLM block ids, and its blocks up to
    `saved` are on the host tier (or were when backed up)."""

    request: Request
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0
    loading: Loading | None = None


class SchedulerSide:
    """The host tier's directory and the store's view, answering vLLM's scheduler."""

    def __init__(self, job: Job, num_blocks: int) -> None:
        self.job, self.block_size = job, job.model.page_size
        self.directory = HostDirectory(host_pages(job, num_blocks * self.block_size))
        self.view: StoreView | None = pipeline.open_store(job) if job.storage.attached else None
        self._matches: dict[str, Match] = {}
        self._tracked: dict[str, Tracked] = {}
        self._held: list[int] = []
        """Pages the last step's moves used: unpinned as the next step is built (a worker
        ends each step's moves before it returns)."""
        self._pinning: list[int] = []
        """Pages pinned for this step's loads, as vLLM allocated their blocks."""
        self._fetched: list[Moves] = []
        self.events = TierEvents(job)

    def matched(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens past `num_computed_tokens` the host tier and then the store hold, in whole
        blocks, leaving the prompt's last token to compute (vLLM samples from it); the
        store's no more than the host pages they can land in now."""
        start = num_computed_tokens // self.block_size
        limit = (request.num_tokens - 1) // self.block_size
        hashes: list[BlockHash] = list(request.block_hashes[start:limit])
        on_host = self.directory.leading(hashes)
        rest = hashes[on_host:]
        in_store = 0
        rest = rest[: self.directory.room()]  # the store's blocks land in host pages
        if self.view is not None and rest:
            in_store = self.view.lookup(pipeline.page_keys(self.job, rest))
        self._matches[request.request_id] = Match(start, hashes[:on_host], rest[:in_store])
        return (on_host + in_store) * self.block_size

    def allocated(self, request: Request, num_external_tokens: int) -> None:
        """vLLM gave the request blocks for `num_external_tokens` loaded ones: their host
        pages, pinned now (the store's placed, evicting the least recent unpinned pages)."""
        tracked = self._tracked.setdefault(request.request_id, Tracked(request))
        match = self._matches.pop(request.request_id, None)
        if match is None or num_external_tokens == 0:
            return
        blocks = num_external_tokens // self.block_size
        host = match.host[:blocks]
        store = match.store[: blocks - len(host)]
        load = Loading(match.start, host, self.directory.pages_of(host), store)
        placed = self.directory.place(store)
        if placed is None:  # too few pages: reported as load errors, vLLM recomputes them
            load.missing = True
        else:
            load.placed = placed
        self._pinning += load.host_pages + load.placed.pages
        tracked.loading = load

    def step(self, output: SchedulerOutput) -> StepMeta:
        """This step's moves: loads placed at allocation, backups of the blocks it fills."""
        self.directory.unpin(self._held)
        meta, self._held, self._pinning, self._fetched = StepMeta(), self._pinning, [], []
        self._follow(output)
        for tracked in self._tracked.values():
            if tracked.loading is not None:
                self._load(meta, tracked, tracked.loading)
                tracked.loading = None
        for request_id, count in output.num_scheduled_tokens.items():
            if request_id in self._tracked:
                scheduled = self._tracked[request_id]
                self._back_up(meta, scheduled, scheduled.request.num_computed_tokens + count)
        return meta

    def close(self) -> None:
        if self.view is not None:
            self.view.close()

    def finished(self, request: Request) -> None:
        self._tracked.pop(request.request_id, None)
        self._matches.pop(request.request_id, None)

    def failed(self, invalid_blocks: set[int]) -> None:
        """Blocks the workers could not load from the store (they freed the pages): forgotten;
        vLLM recomputes them."""
        pairs = [pair for m in self._fetched for pair in zip(m.blocks, m.hashes, strict=True)]
        self.events.evicted(self.directory.drop([h for b, h in pairs if b in invalid_blocks]))

    def _follow(self, output: SchedulerOutput) -> None:
        """Each scheduled request's block ids, as vLLM assigned them."""
        for new in output.scheduled_new_reqs:
            if new.req_id in self._tracked:
                self._tracked[new.req_id].block_ids = list(new.block_ids[0])
        cached = output.scheduled_cached_reqs
        for request_id, new_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            tracked = self._tracked.get(request_id)
            if tracked is None or new_ids is None:
                continue
            if request_id in cached.resumed_req_ids:
                tracked.block_ids = list(new_ids[0])
            else:
                tracked.block_ids += new_ids[0]

    def _load(self, meta: StepMeta, tracked: Tracked, load: Loading) -> None:
        ids, first = tracked.block_ids, load.start
        middle = first + len(load.host)
        if load.host:
            meta.host_loads.append(Moves(ids[first:middle], load.host_pages, load.host))
        end = middle + len(load.store)
        if load.missing:
            meta.missing += ids[middle:end]
        elif load.store:
            moves = Moves(ids[middle:end], load.placed.pages, load.store)
            meta.frees += load.placed.evicted
            meta.store_loads.append(moves)
            self._fetched.append(moves)
            self.events.evicted(load.placed.evicted_hashes)
            self.events.host_loaded(tracked.request, range(middle, end))
        tracked.saved = max(tracked.saved, end)

    def _back_up(self, meta: StepMeta, tracked: Tracked, computed: int) -> None:
        """Back up the request's blocks this step fills that the host tier lacks."""
        hashes = tracked.request.block_hashes
        full = min(computed // self.block_size, len(hashes))
        todo = [i for i in range(tracked.saved, full) if hashes[i] not in self.directory]
        tracked.saved = max(tracked.saved, full)
        if not todo:
            return
        placed = self.directory.place([hashes[i] for i in todo])
        if placed is None:
            return  # every page is in use this step: these blocks stay on the device only
        meta.frees += placed.evicted
        blocks = [tracked.block_ids[i] for i in todo]
        meta.backups.append(Moves(blocks, placed.pages, [hashes[i] for i in todo]))
        self._held += placed.pages  # unpinned as the next step is built: the backup is done
        self.events.evicted(placed.evicted_hashes)
        self.events.backed_up(tracked.request, todo)
