"""The one way an engine is made: `open_engine` (this rank's process groups, streams, pools and
L3 tier) or `engine_on` (on a runtime the caller keeps, as the benches do for many cases).

Everything an engine is made from is an `EngineRecipe`, which holds nothing of Hydra: a `Job`
hands its own over (`Job.recipe`), so the public API, every job and the tests build engines
the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pipeline.core.events import EventsConfig
from pipeline.core.l3 import Checks, PageObject, largest_object, namespace, page_roles, share_of
from pipeline.core.model import ModelGeometry
from pipeline.core.ownership import OwnerMap, Ownership
from pipeline.core.sizing import PoolBudget, size_rank
from pipeline.core.storage import StorageConfig
from pipeline.core.topology import Backend, IoBackend, Topology
from pipeline.engine.acks import AckLedger
from pipeline.engine.adopt import Adopted, Key, page_views
from pipeline.engine.allocate import allocate
from pipeline.engine.cuda.streams import WorkerStream
from pipeline.engine.engine import Engine
from pipeline.engine.events import KvEvents, Place, open_events
from pipeline.engine.l3.groups import cut_store
from pipeline.engine.l3.scratch import Scratches
from pipeline.engine.l3.stores import ObjectStore, open_store
from pipeline.engine.l3.stores.files import read_key_file
from pipeline.engine.l3.tier import L3Tier
from pipeline.engine.runtime import Runtime, pick_backend, pick_device
from pipeline.engine.strategy import Strategy
from pipeline.engine.transfer.graphs import TransferGraphs
from pipeline.engine.transfer.state import Resources


@dataclass(frozen=True)
class EngineRecipe:
    """What one rank's engine is made of."""

    strategy: Strategy
    """The effective strategy, its stages instantiated."""
    model: ModelGeometry
    topology: Topology
    """Normalized: the layout and io backend that run."""
    storage: StorageConfig
    budget: PoolBudget
    events: EventsConfig = field(default_factory=EventsConfig)
    """Where the engine publishes KV events (none: nowhere)."""
    backend: Backend = Backend.auto
    timeout_s: float = 120.0
    """Every collective's and rank join's timeout."""
    debug_consensus: bool = False
    metrics_port: int | None = None
    """Serve `/metrics` on this port + the global rank (None: no listener)."""
    metrics_address: str = "127.0.0.1"

    def backend_name(self, local_rank: int = 0) -> str:
        """The process-group backend its ranks use (the parent and every rank agree)."""
        return pick_backend(self.backend, pick_device(self.topology.device, local_rank))

    def start_runtime(
        self,
        local_rank: int,
        *,
        group: dist.ProcessGroup | None = None,
        cpu_group: dist.ProcessGroup | None = None,
    ) -> Runtime:
        """This rank's process groups and streams, over `group`'s ranks (None: the default
        group's; see `Runtime.start`)."""
        return Runtime.start(
            self.topology,
            self.model,
            group=group,
            cpu_group=cpu_group,
            device=pick_device(self.topology.device, local_rank),
            backend=self.backend_name(local_rank),
            timeout_s=self.timeout_s,
        )


def open_engine(
    recipe: EngineRecipe,
    local_rank: int,
    *,
    group: dist.ProcessGroup | None = None,
    cpu_group: dist.ProcessGroup | None = None,
    keep_trace: bool = False,
    device_kv: Adopted | None = None,
) -> Engine:
    """This rank's engine on its own runtime, which `Engine.close` closes (`group`: the ranks
    holding the same KV, None: the default group; `cpu_group`: the caller's gloo group over
    them; `keep_trace`: every op in order; `device_kv`: the caller's KV tensors as the device
    pool, see adopt; refused before any group is made when they do not fit), serving its
    metrics if the recipe asks (on the port plus the global rank: engines share a host)."""
    views = None if device_kv is None else page_views(recipe.model, device_kv)
    runtime = recipe.start_runtime(local_rank, group=group, cpu_group=cpu_group)
    try:
        engine = engine_on(recipe, runtime, keep_trace=keep_trace, device_kv=views)
    except BaseException:
        runtime.close()
        raise
    if recipe.metrics_port is not None:
        try:
            engine.metrics.serve(recipe.metrics_address, recipe.metrics_port + dist.get_rank())
        except BaseException:
            engine.close()
            raise
    return engine


def engine_on(
    recipe: EngineRecipe,
    runtime: Runtime,
    *,
    keep_trace: bool = False,
    device_kv: Mapping[Key, torch.Tensor] | None = None,
    store: ObjectStore | None = None,
) -> Engine:
    """The engine's pools and L3 tier on `runtime` (`store`: the caller's, kept open by it;
    `device_kv`: page views of adopted tensors, which then size the device pool)."""
    model, topology, config = recipe.model, recipe.topology, recipe.strategy.config
    budget = recipe.budget
    if device_kv:  # `DevicePool.adopt` checks each tensor
        pages = min((t.shape[0] for t in device_kv.values() if t.dim() == 3), default=0)
        tokens = pages * model.page_size * topology.dcp_size
        budget = dataclasses.replace(budget, device_tokens=tokens)
    sizing = size_rank(model, topology, config, runtime.rank, budget)
    owners = sizing.owners
    uva = runtime.device.type == "cuda" and topology.io_backend is IoBackend.kernel
    graphs = config.cuda_graph_cache if uva else 0  # kernels reach the host pool by UVA
    res = allocate(runtime, model, topology, config, owners, sizing, uva, keep_trace, device_kv)
    acks = ack_ledger(recipe, runtime)
    tier = open_tier(recipe.storage, runtime, model, topology, owners, res, store)
    events = None
    try:
        events = events_of(recipe, runtime)
        engine = Engine(
            strategy=recipe.strategy,
            runtime=runtime,
            model=model,
            topology=topology,
            sizing=sizing,
            resources=res,
            acks=acks,
            graphs=TransferGraphs(graphs) if graphs else None,
            l3=tier,
            events=events,
        )
    except BaseException:
        if tier is not None:  # its store, threads and registrations: the caller has no engine
            tier.close()
        if events is not None:
            events.close()
        raise
    if events is not None:
        events.watch(engine.host_allocator, tier)
    return engine


def ack_ledger(recipe: EngineRecipe, runtime: Runtime) -> AckLedger:
    """The engine's ack ledger over its gloo group, with the strategy's idle-sync skip."""
    config = recipe.strategy.config
    return AckLedger(
        runtime.cpu_group,
        skip_enabled=config.idle_sync_skip.enabled,
        max_skips=config.idle_sync_skip.max_skips,
        storage_attached=recipe.storage.attached,
        debug_consensus=recipe.debug_consensus,
        poll_timer_every=config.poll_timer_every,
        notes=runtime.notes,
    )


def events_of(recipe: EngineRecipe, runtime: Runtime) -> KvEvents | None:
    """The rank's KV events (`open_events`): one publisher per rank where each rank holds
    its own copy (replicated), else one per replica group; placed by the engine's ranks in
    the world (its dp rank, the world's metrics ports)."""
    per_rank = recipe.strategy.config.ownership is Ownership.replicated
    world = dist.get_world_size()
    port = recipe.metrics_port
    metrics = None if port is None else range(port, port + world)
    place = Place(runtime.rank, runtime.global_ranks[0], world, metrics)
    model, topology = recipe.model, recipe.topology
    return open_events(recipe.events, recipe.storage, topology, model, place, per_rank=per_rank)


def on_same_memory(engine: Engine, strategy: Strategy) -> Engine:
    """`engine`'s pools and buffers under other knobs of the same strategy (its own graphs),
    so both sides of an in-turn comparison move the same bytes between the same memory."""
    graphs = strategy.config.cuda_graph_cache if engine.graphs is not None else 0
    twin = Engine(
        strategy=strategy,
        runtime=engine.runtime,
        model=engine.model,
        topology=engine.topology,
        sizing=engine.sizing,
        resources=engine.resources,
        acks=engine.acks,
        graphs=TransferGraphs(graphs) if graphs else None,
    )
    twin.host_allocator = engine.host_allocator  # the same host pages, the same owner
    return twin


def open_tier(
    storage: StorageConfig | None,
    runtime: Runtime,
    model: ModelGeometry,
    topology: Topology,
    owners: OwnerMap,
    res: Resources,
    store: ObjectStore | None = None,
) -> L3Tier | None:
    """The rank's L3 tier, or None without a store: it joins the store (its folder or master
    resolved by the job), or uses `store`, opened by the caller for objects of up to
    `largest_object(model)` bytes."""
    if storage is None or not storage.attached:
        return None
    obj = PageObject(share_of(topology, model, runtime.rank), model.units)
    space = namespace(model, storage.model_revision, storage.tenant)
    key = read_key_file(storage.auth_key_file) if storage.auth_key_file else None
    longest = obj.header_size(space, obj.name(space, "0" * 32), Checks(b"longest digests"))
    with contextlib.ExitStack() as undo:  # what is opened closes again if a later step fails
        if store is None:
            opened = open_store(storage, largest_object(model), timeout_s=runtime.timeout_s)
            undo.callback(opened.close)
        stream = WorkerStream(f"l3-{runtime.rank}", runtime.timeout_s)
        undo.callback(stream.close)
        io = ThreadPoolExecutor(storage.io_threads, thread_name_prefix=f"l3-io-{runtime.rank}")
        undo.callback(io.shutdown)
        tier = L3Tier(
            store=store or opened,
            owns_store=store is None,
            space=space,
            obj=obj,
            roles=page_roles(owners, model.units, runtime.rank),
            runtime=runtime,
            res=res,
            stream=stream,
            io=io,
            scratches=Scratches(obj, longest, storage.io_threads),
            owners=owners,
            storage=storage,
            checks=Checks(key),
        )
        tier.store.register(tier.memory())
        cut_store(tier.store, tier.space, obj, storage.stream_layers)
        undo.pop_all()
    return tier
