"""What a serving engine calls on one rank: `backup`, `load` (per-layer waits), the forward
gate, `host_slots`, `poll`, and with an L3 store `write_back`, `lookup` and `load_from_l3`.
`engine.factory` makes one (groups, pools, L3 tier); the constructor only stores them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

import torch

from pipeline.core.l3 import prefix_keys
from pipeline.core.model import ModelGeometry
from pipeline.core.ownership import OwnerMap
from pipeline.core.plan import Direction, PlanSpec, StepsCache, build_plan
from pipeline.core.sizing import Sizing
from pipeline.core.slots import PageAllocator
from pipeline.core.strategy import Ordering
from pipeline.core.topology import Topology
from pipeline.engine import l3_calls as calls
from pipeline.engine.acks import Ack, AckLedger, digest_of
from pipeline.engine.cuda.streams import Event, Stream, follow
from pipeline.engine.events import Keys, KvEvents, backed_up
from pipeline.engine.host_slots import HostSlots
from pipeline.engine.l3.handles import L3Load
from pipeline.engine.l3.jobs import prefetch_job
from pipeline.engine.l3.prefetch import Prefetch, start
from pipeline.engine.l3.tier import L3Tier
from pipeline.engine.metrics import EngineMetrics, readings
from pipeline.engine.runtime import Runtime
from pipeline.engine.strategy import Strategy
from pipeline.engine.transfer.batches import BatchRing
from pipeline.engine.transfer.executor import LoadHandle, issue_copies, issue_transfer, prepare
from pipeline.engine.transfer.graphs import TransferGraphs
from pipeline.engine.transfer.pools import DevicePool, HostPool
from pipeline.engine.transfer.state import Resources, Trace, Transfer


class Engine:
    """One rank's device and host tiers, and the strategy that moves bytes between them."""

    def __init__(
        self,
        *,
        strategy: Strategy,
        runtime: Runtime,
        model: ModelGeometry,
        topology: Topology,
        sizing: Sizing,
        resources: Resources,
        acks: AckLedger,
        graphs: TransferGraphs | None = None,
        l3: L3Tier | None = None,
        events: KvEvents | None = None,
    ) -> None:
        self.strategy = strategy
        self.runtime = runtime
        self.model = model
        self.topology = topology
        self.owners: OwnerMap = sizing.owners
        self.sizing = sizing
        self.resources = resources
        self.device_pool: DevicePool = resources.device_pool
        self.host_pool: HostPool = resources.host_pool
        self.trace: Trace = resources.trace
        self.acks = acks
        """Submitted transfers in order, released by `poll`."""
        self.graphs = graphs
        """CUDA graphs of gated transfers, per shape (cuda with io_backend=kernel only)."""
        self.l3 = l3
        """The L3 store's tier (None with storage=none)."""
        spec = PlanSpec.of(model, topology, strategy.config, sizing, runtime.rank)
        self.spec = resources.fitted(spec)
        """What every transfer plan of this rank shares (its knobs included)."""
        self.host_allocator = PageAllocator(sizing.host.num_pages)
        """Host pages, handed out identically on every rank (replicated state); by page, for
        the jobs: a serving engine uses `host_slots`."""
        self._gate: list[Event] = []
        self._known_steps = StepsCache()
        self._loads = 0
        self._last_backup: Event | None = None  # a write-back starts after it (in order)
        self._broken: str | None = None
        """Why the engine refuses every call: a failed transfer left its state unknown."""
        self._closed = False
        self._l3_pages = {"hits": 0, "misses": 0}  # what lookups found, for the metrics
        # (read from the engine's parts, not the engine: a cycle would keep a closed engine's
        # streams and their threads alive until a garbage collection)
        read = partial(readings, self.trace, self.host_allocator, l3, self._l3_pages, events)
        self.metrics = EngineMetrics(runtime.rank, read)
        """This rank's Prometheus registry (`stats()`; served with runtime.metrics_port)."""
        self.events = events  # what this rank publishes of its tiers (None: nothing)

    @property
    def num_pending_acks(self) -> int:
        """Acks not yet released by `poll()`: alike on every rank, so each may poll while > 0."""
        return len(self.acks.pending)

    @property
    def host_slots(self) -> HostSlots:
        """The host tier's slots: `alloc`, `free` after an eviction, `reuse` for load_from_l3."""
        return HostSlots(self.host_allocator, self.sizing.slots_per_page)

    def backup(
        self, host_indices: torch.Tensor, device_indices: torch.Tensor, keys: Keys = None
    ) -> Event:
        """Copy device slots to host slots of the caller's (`host_slots.alloc`); the ack. ValueError
        naming the argument for malformed slots, or host slots not allocated or lent. `keys`
        (a page key per page, optional) name the pages in the host tier's KV events."""
        self._usable()
        stream, graphs = self.runtime.write_stream, self.graphs
        t = self.transfer(Direction.backup, host_indices, device_indices, stream, graphs)
        said = backed_up(self.events, t.plan.host_pages, keys)
        self.host_allocator.hold_data(t.plan.host_pages)
        issue_transfer(self.strategy.backup, t, stream, stream, graphs)
        self.acks.submit("backup", t.done, said)
        self._last_backup = t.done
        return t.done

    def load(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> LoadHandle:
        """Copy host slots into device slots (a collective): per-layer waits, ack. Refused
        like `backup`, and for host slots without data (or not allocated)."""
        self._usable()
        stream, pipeline = self.runtime.load_stream, self.strategy.load
        lazy = self.strategy.config.ordering is Ordering.forward_stream
        graphs = None if lazy else self.graphs
        t = self.transfer(Direction.load, host_indices, device_indices, stream, graphs)
        if lazy:  # the consumer's waits issue the exchanges
            prepare(pipeline, t, stream)
            issue_copies(pipeline, t, stream)
        else:
            issue_transfer(pipeline, t, stream, self.runtime.exchange_stream, graphs)
            self._gate.append(t.done)
        self.acks.submit("load", t.done)
        return LoadHandle(t, pipeline, lazy=lazy, forward=self.runtime.forward_stream)

    def l3_keys(self, tokens: Sequence[int]) -> list[str]:
        """One L3 key per page of a prefix's token ids (whole pages, from its first token)."""
        keys = prefix_keys(tokens, self.sizing.slots_per_page, self._l3().space)
        if self.events is not None:
            self.events.keyed(keys, tokens)
        return keys

    def write_back(self, keys: list[str], host_indices: torch.Tensor) -> Event:
        """Store backed-up host slots in L3 under their page keys, on the write-back thread
        after every backup so far; the ack: this rank's objects are stored (free after it).
        Refused for host slots not allocated, a prefetch's, or holding no data."""
        return calls.write_back(self, self._l3(), keys, host_indices, self._last_backup)

    def lookup(self, keys: list[str]) -> int:
        """Pages at the front of `keys` the replica group can load from L3 (a collective; 0
        below `storage.min_hit_pages`)."""
        tier = self._l3()
        found = tier.lookup(keys)
        found = found if found >= tier.storage.min_hit_pages else 0
        self._l3_pages["hits"] += found
        self._l3_pages["misses"] += len(keys) - found
        return found

    def load_from_l3(
        self, keys: list[str], host_indices: torch.Tensor, device_indices: torch.Tensor
    ) -> L3Load:
        """Read `keys`' pages from L3 into free host slots; load the leading pages every
        reader found intact to device slots (a collective): a group of layers at a time as
        the forward waits for them where the load streams (`storage.stream_layers`), else
        window by window as read. Refused for host slots not allocated, a prefetch's, or
        holding data."""
        return calls.load_from_l3(self, self._l3(), keys, (host_indices, device_indices))

    def prefetch(self, keys: list[str], host_indices: torch.Tensor) -> Prefetch:
        """Start reading `keys`' pages from L3 into free host slots (that hold no data, from
        `host_slots.alloc`) on the I/O threads, and return at once (a collective: it agrees on
        the plan); `Prefetch.ready()` counts this rank's leading pages read so far. The slots
        are the prefetch's until `load_prefetched` or `Prefetch.cancel` (see `host_slots`)."""
        tier = self._l3()
        job = prefetch_job(keys, host_indices, self.spec, self.host_allocator)
        return start(tier, job, host_indices, self.strategy.l3.fetch, self.host_allocator)

    def load_prefetched(self, prefetch: Prefetch, device_indices: torch.Tensor) -> L3Load:
        """Agree under `storage.prefetch_policy` on the leading pages every reader of the group
        has read intact, load them to `device_indices` (one per prefetched page), and give the
        slots of the other pages back to the free list, on every rank (a collective). A
        prefetch ended already or bad `device_indices` on any rank raise ValueError on every
        rank before anything changes; the prefetch stays usable (load it again, or cancel)."""
        return calls.load_prefetched(self, self._l3(), prefetch, device_indices)

    def _l3(self) -> L3Tier:
        self._usable()
        if self.l3 is None:
            raise RuntimeError("no L3 store is attached: pick storage=file or mooncake")
        return self.l3

    def close(self) -> None:
        """Release the graphs (they hold NCCL work), the L3 tier, the runtime; then refuse."""
        if self._closed:
            return
        self._closed = True
        self.metrics.close()
        if self.graphs is not None:
            self.graphs.clear()
        if self.l3 is not None:
            self.l3.close()
        if self.events is not None:
            self.events.close()
        self.runtime.close()

    def poll(self) -> list[Ack]:
        """Release the acks every rank has seen complete; a collective, see `AckLedger.poll`."""
        self._usable()
        released = self.acks.poll(self.state_digest)
        now = time.monotonic()
        for ack in released:
            self.metrics.observe(ack.kind, now - ack.submitted_s)
        if self.events is not None:
            self.events.released(released)
        return released

    def stats(self) -> dict[str, float]:
        """This rank's metrics as a scrape of `/metrics` shows them (see `engine.metrics`)."""
        return self.metrics.stats()

    def state_digest(self) -> int:
        """Digest of this rank's replicated state: host allocator free list and ack ledger."""
        ledger = [(a.seq, a.kind) for a in self.acks.pending]
        return digest_of(self.host_allocator.free_pages(), ledger)

    def begin_forward(self, forward: Stream | None = None) -> None:
        """The forward gate: `forward` (default: the forward stream) waits for every load
        submitted since the last forward, so no broadcast can interleave with its collectives."""
        self._usable()
        forward = forward or self.runtime.forward_stream
        for event in self._gate:
            forward.wait_event(event)
        self._gate.clear()

    def transfer(
        self,
        direction: Direction,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        stream: Stream,
        graphs: TransferGraphs | None,
        breaks: frozenset[int] = frozenset(),
    ) -> Transfer:
        """Plan (indices checked first) and set up one transfer on `stream` (`breaks`: a load's)."""
        load = direction is Direction.load
        plan = build_plan(  # raises on bad input: nothing counted, nothing issued
            direction,
            host_indices,
            device_indices,
            self.spec,
            graphed=graphs is not None,
            verify=load and self.verifies_next_load(),
            known_steps=self._known_steps,
            breaks=breaks,
        )
        if load:  # pages with data (`require_data` says why not: lent, not allocated)
            self.host_allocator.require_data("host_indices", plan.host_pages)
        else:  # pages this caller allocated and has not lent to a prefetch
            self.host_allocator.require_own("host_indices", plan.host_pages)
        self._loads += load
        # The transfer must see everything the forward stream did to these slots so far.
        follow(stream, self.runtime.forward_stream)
        # a graph's layer events are its own; else a load's, a layer's or a group's (`layer_events`)
        own_events = load and graphs is None
        gathers, res = not load and self.spec.batch_buffer_bytes > 0, self.resources
        return Transfer(
            plan=plan,
            res=res,
            layer_events=plan.layout.layer_events(stream.new_event) if own_events else {},
            done=stream.new_event(),
            all_copied=stream.new_event(),
            batches=BatchRing(res.batch_buffers, res.gather_stream) if gathers else None,
            on_fail=self._failed,
        )

    def verifies_next_load(self) -> bool:
        """The next load checks its bytes across the replica group (`strategy.verify_every`)."""
        every = self.strategy.config.verify_every
        return every > 0 and self._loads % every == 0

    def _usable(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is closed: create a new one")
        if self._broken is not None:
            raise RuntimeError(f"the engine is broken because {self._broken}: make a new one")

    def _failed(self, t: Transfer, error: BaseException) -> None:
        """A transfer failed (its own events carry the error). Its host pages hold no data
        after a failed backup. Where it had started collectives, or a CUDA graph, the ranks'
        shared state is unknown, and the engine refuses every later call."""
        plan = t.plan
        if plan.direction is Direction.backup:
            self.host_allocator.hold_data(plan.host_pages, held=False)
        collective = plan.verify or any(plan.exchanged(u) for u in plan.spec.units)
        if collective or plan.graphed:
            where = "its collectives on the transfer group" if collective else "its CUDA graph"
            self._broken = (
                f"a {plan.direction.value} failed ({error}) and {where} may be out of step"
            )
