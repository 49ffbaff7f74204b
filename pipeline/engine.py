"""The engine API of one rank: `backup`, `load` (with per-layer waits) and the forward gate.

This is what a serving engine calls. `Engine.create` allocates the pools (after `Runtime.start`
made the process groups); the constructor only stores what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.acks import Ack, AckLedger, digest_of
from pipeline.assemble import Strategy
from pipeline.context import Event, Stream, Trace, TransferContext
from pipeline.executor import LoadHandle, issue_steps, issue_transfer, prepare
from pipeline.graphs import TransferGraphs
from pipeline.ownership import OwnerMap, owner_map
from pipeline.plan import Direction, StepsCache, TransferPlan, build_plan
from pipeline.pools import DevicePool, HostCapacity, HostPool, PageAllocator, host_capacity
from pipeline.runtime import Runtime
from pipeline.schema import Ordering
from pipeline.topology import IoBackend, ModelGeometry, StorageBackend, Topology, by_pool_kind


@dataclass(frozen=True)
class Sizing:
    """Pool sizes of one rank, in local pages (a local page is page_size rows)."""

    device_pages: int
    host: HostCapacity
    widened: int
    """Logical slots per page (page_size x dcp_size)."""

    @property
    def device_slots(self) -> int:
        return self.device_pages * self.widened

    @property
    def host_slots(self) -> int:
        return self.host.num_pages * self.widened


def size_pools(
    model: ModelGeometry,
    topology: Topology,
    owners: OwnerMap,
    rank: int,
    *,
    device_tokens: int,
    host_ratio: float,
    keep_capacity: bool,
) -> Sizing:
    """Device pages from `device_tokens`; host budget = host_ratio x the device pool's bytes."""
    widened = model.page_size * topology.dcp_size
    if device_tokens % widened:
        raise ValueError(
            f"workload.device_tokens={device_tokens} must be a multiple of "
            f"page_size x dcp_size = {widened}"
        )
    device_pages = device_tokens // widened
    budget = int(host_ratio * device_pages * sum(u.page_bytes for u in model.units))
    return Sizing(device_pages, host_capacity(model, owners, rank, budget, keep_capacity), widened)


def plan_transfer(
    direction: Direction,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    *,
    rank: int,
    model: ModelGeometry,
    topology: Topology,
    owners: OwnerMap,
    sizing: Sizing,
    staging_bytes: int,
    known_steps: StepsCache | None = None,
) -> TransferPlan:
    """The plan of one transfer on `rank` (what the engine runs and what `plan` reports)."""
    return build_plan(
        direction,
        host_indices,
        device_indices,
        rank=rank,
        units=model.units,
        owners=owners,
        page_size=model.page_size,
        dcp_size=topology.dcp_size,
        dcp_rank=topology.dcp_rank(rank),
        host_slots=sizing.host_slots,
        device_slots=sizing.device_slots,
        io_backend=topology.io_backend,
        staging_bytes=staging_bytes,
        known_steps=known_steps,
    )


def exchange_staging_bytes(strategy: Strategy, model: ModelGeometry, owners: OwnerMap) -> int:
    """Bytes of the buffer a load's exchanges gather into and broadcast from (0 without
    exchanged units)."""
    exchanged = any(owners.exchanged(u.ordinal) for u in model.units)
    return strategy.staging_bytes if exchanged else 0


def batch_staging_bytes(
    strategy: Strategy, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Bytes of one of the two buffers a chunked backup gathers its batches into: one batch
    of the widest pool kind this rank copies, at most `staging_bytes` (0 when not chunked)."""
    if strategy.chunk_pages <= 0:
        return 0
    kinds = by_pool_kind(owners.owned(rank, model.units))
    widest = max((sum(u.page_bytes for u in units) for units in kinds), default=0)
    return min(strategy.chunk_pages * widest, strategy.staging_bytes)


def device_staging_bytes(
    strategy: Strategy, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Device memory a rank's engine holds besides its pool: the exchange buffer and the two
    batch buffers."""
    exchange = exchange_staging_bytes(strategy, model, owners)
    return exchange + 2 * batch_staging_bytes(strategy, model, owners, rank)


class Engine:
    """One rank's device and host tiers, and the strategy that moves bytes between them."""

    def __init__(
        self,
        *,
        strategy: Strategy,
        runtime: Runtime,
        model: ModelGeometry,
        topology: Topology,
        owners: OwnerMap,
        sizing: Sizing,
        device_pool: DevicePool,
        host_pool: HostPool,
        host_view: HostPool,
        staging: torch.Tensor,
        batch_staging: torch.Tensor,
        acks: AckLedger,
        graphs: TransferGraphs | None = None,
    ) -> None:
        self.strategy = strategy
        self.runtime = runtime
        self.model = model
        self.topology = topology
        self.owners = owners
        self.sizing = sizing
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.host_view = host_view
        self.staging = staging
        self.batch_staging = batch_staging
        """Two device buffers [2, bytes] a chunked backup gathers its batches into, in turn."""
        self.acks = acks
        """Submitted transfers in order, released by `poll`."""
        self.graphs = graphs
        """CUDA graphs of gated transfers, per shape (cuda with io_backend=kernel only)."""
        self.host_allocator = PageAllocator(sizing.host.num_pages)
        """Host slots, handed out identically on every rank (replicated state)."""
        self.trace = Trace()
        self.timings_s: dict[str, float] = {}
        """Seconds per stage over all transfers (issue time on cuda)."""
        self._gate: list[Event] = []
        self._layers = tuple(range(model.num_layers))
        self._known_steps = StepsCache()
        self._sequence = {Direction.backup: 0, Direction.load: 0}

    @classmethod
    def create(
        cls,
        strategy: Strategy,
        runtime: Runtime,
        model: ModelGeometry,
        topology: Topology,
        *,
        device_tokens: int,
        host_ratio: float,
        debug_consensus: bool = False,
    ) -> Engine:
        """Allocate the pools of this rank (topology already normalized)."""
        owners = owner_map(strategy.ownership, runtime.replica_group, model.units)
        sizing = size_pools(
            model,
            topology,
            owners,
            runtime.rank,
            device_tokens=device_tokens,
            host_ratio=host_ratio,
            keep_capacity=strategy.keep_capacity,
        )
        exchanged = [u for u in model.units if owners.exchanged(u.ordinal)]
        widest_page = max((u.page_bytes for u in exchanged), default=0)
        if widest_page > strategy.staging_bytes:
            raise ValueError(
                f"strategy.staging_bytes={strategy.staging_bytes} is smaller than "
                f"one page of a layer ({widest_page} B); raise it"
            )
        device = runtime.device
        on_cuda = device.type == "cuda"
        host_pool = HostPool.allocate(
            model,
            owners.owned(runtime.rank, model.units),
            sizing.host.num_pages,
            topology.mem_layout,
            pin_memory=on_cuda,
        )
        uva = on_cuda and topology.io_backend is IoBackend.kernel
        host_view = (
            host_pool.alias([uva_alias(b, device) for b in host_pool.storage]) if uva else host_pool
        )
        return cls(
            strategy=strategy,
            runtime=runtime,
            model=model,
            topology=topology,
            owners=owners,
            sizing=sizing,
            device_pool=DevicePool.allocate(model, sizing.device_pages, device),
            host_pool=host_pool,
            host_view=host_view,
            staging=torch.empty(
                exchange_staging_bytes(strategy, model, owners), dtype=torch.uint8, device=device
            ),
            batch_staging=torch.empty(
                (2, batch_staging_bytes(strategy, model, owners, runtime.rank)),
                dtype=torch.uint8,
                device=device,
            ),
            acks=AckLedger(
                runtime.cpu_group,
                skip_enabled=strategy.idle_sync_skip.enabled,
                max_skips=strategy.idle_sync_skip.max_skips,
                storage_attached=topology.storage_backend is not StorageBackend.none,
                debug_consensus=debug_consensus,
                poll_timer_every=strategy.poll_timer_every,
            ),
            graphs=TransferGraphs(strategy.cuda_graphs)
            if uva and strategy.cuda_graphs > 0
            else None,
        )

    def backup(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> Event:
        """Copy device slots to host slots (logical, CPU int64); returns the ack event."""
        stream = self.runtime.write_stream
        graphs = self.graphs
        ctx = self._context(
            Direction.backup, host_indices, device_indices, stream, graphed=graphs is not None
        )
        issue_transfer(self.strategy.backup, ctx, stream, stream, graphs)
        self.acks.submit("backup", ctx.done)
        return ctx.done

    def load(self, host_indices: torch.Tensor, device_indices: torch.Tensor) -> LoadHandle:
        """Copy host slots into device slots; the handle waits per layer and acks at the end."""
        stream, pipeline = self.runtime.load_stream, self.strategy.load
        lazy = self.strategy.ordering is Ordering.forward_stream
        graphs = None if lazy else self.graphs
        ctx = self._context(
            Direction.load, host_indices, device_indices, stream, graphed=graphs is not None
        )
        if lazy:  # the consumer's waits issue the exchanges
            prepare(pipeline, ctx, stream)
            issue_steps(pipeline, ctx, stream)
        else:
            issue_transfer(pipeline, ctx, stream, self.runtime.exchange_stream, graphs)
            self._gate.append(ctx.done)
        self.acks.submit("load", ctx.done)
        return LoadHandle(ctx, pipeline, lazy=lazy)

    def close(self) -> None:
        """Release the graphs, then the runtime (graphs hold the transfer group's NCCL work)."""
        if self.graphs is not None:
            self.graphs.clear()
        self.runtime.close()

    def poll(self) -> list[Ack]:
        """Release the acks that every rank has seen complete (the same ones everywhere)."""
        return self.acks.poll(self.state_digest)

    def state_digest(self) -> int:
        """Digest of this rank's replicated state: host allocator free list and ack ledger."""
        ledger = [(a.seq, a.kind) for a in self.acks.pending]
        return digest_of(self.host_allocator.free_pages(), ledger)

    def begin_forward(self, forward: Stream) -> None:
        """The forward gate: `forward` waits for every load submitted since the last forward,
        so no broadcast can interleave with the forward's collectives."""
        for event in self._gate:
            forward.wait_event(event)
        self._gate.clear()

    def _context(
        self,
        direction: Direction,
        host_indices: torch.Tensor,
        device_indices: torch.Tensor,
        stream: Stream,
        *,
        graphed: bool,
    ) -> TransferContext:
        """Plan (validating the indices before any byte moves) and set up one transfer
        (`graphed`: its layer events come from a CUDA graph)."""
        plan = plan_transfer(
            direction,
            host_indices,
            device_indices,
            rank=self.runtime.rank,
            model=self.model,
            topology=self.topology,
            owners=self.owners,
            sizing=self.sizing,
            staging_bytes=self.strategy.staging_bytes,
            known_steps=self._known_steps,
        )
        layers = self._layers if direction is Direction.load else ()
        sequence = self._sequence[direction]
        self._sequence[direction] += 1
        every = self.strategy.verify_every
        steps = (
            plan.chunked(self.strategy.chunk_pages, self.strategy.staging_bytes)
            if direction is Direction.backup
            else plan.steps
        )
        # The transfer must see everything the forward stream did to these slots so far.
        forward = self.runtime.forward_stream
        ready = forward.new_event()
        forward.record(ready)
        stream.wait_event(ready)
        return TransferContext(
            plan=plan,
            device_pool=self.device_pool,
            host_pool=self.host_pool,
            group=self.runtime.transfer_group,
            device=self.runtime.device,
            trace=self.trace,
            host_view=self.host_view,
            copy_pages=self.runtime.copy_pages,
            staging=self.staging,
            batch_staging=self.batch_staging if direction is Direction.backup else None,
            gather_stream=self.runtime.gather_stream,
            layers=layers,
            layer_events={} if graphed else {layer: stream.new_event() for layer in layers},
            done=stream.new_event(),
            all_copied=stream.new_event(),
            ordered=True,
            verify=direction is Direction.load and every > 0 and sequence % every == 0,
            steps=steps,
            timings_s=self.timings_s,
        )


class _CudaArray:
    """Exposes a pinned host buffer through __cuda_array_interface__ (UVA: same address)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": (host.nbytes,),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "version": 3,
        }


def uva_alias(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A cuda tensor over the same pinned host memory, so gather/scatter kernels reach it."""
    assert host.is_pinned() and host.is_contiguous(), "UVA aliases whole pinned buffers"
    flat = torch.as_tensor(_CudaArray(host), device=device)
    return flat.view(host.dtype).view(host.shape)
