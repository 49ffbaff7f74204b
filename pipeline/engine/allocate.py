"""The pools and buffers of one rank's engine, made once when it is created."""

from __future__ import annotations

import torch

from pipeline.engine.pools import DevicePool, HostPool, uva_alias
from pipeline.engine.runtime import Runtime
from pipeline.engine.transfer import Resources, Trace
from pipeline.spec.model import ModelGeometry
from pipeline.spec.ownership import OwnerMap
from pipeline.spec.sizing import Sizing, batch_buffer_bytes, exchange_staging_bytes
from pipeline.spec.strategy import StrategyConfig
from pipeline.spec.topology import Topology


def allocate(
    runtime: Runtime,
    model: ModelGeometry,
    topology: Topology,
    config: StrategyConfig,
    owners: OwnerMap,
    sizing: Sizing,
    *,
    uva: bool,
    keep_trace: bool,
) -> Resources:
    """The pools and buffers of one rank's engine (`uva`: kernels reach the host pool through
    its UVA alias)."""
    rank, device = runtime.rank, runtime.device
    owned = owners.owned(rank, model.units)
    host_pool = HostPool.allocate(
        model, owned, sizing.host.num_pages, topology.mem_layout, pin_memory=device.type == "cuda"
    )
    host_view = (
        host_pool.alias([uva_alias(b, device) for b in host_pool.storage]) if uva else host_pool
    )

    def device_bytes(n: int, *shape: int) -> torch.Tensor:
        return torch.empty((*shape, n), dtype=torch.uint8, device=device)

    return Resources(
        device=device,
        device_pool=DevicePool.allocate(model, sizing.device_pages, device),
        host_pool=host_pool,
        host_view=host_view,
        collectives=runtime.collectives,
        copy_pages=runtime.copy_pages,
        staging=device_bytes(exchange_staging_bytes(config, model, owners)),
        batch_buffers=device_bytes(batch_buffer_bytes(config, model, owners, rank), 2),
        gather_stream=runtime.gather_stream,
        trace=Trace(keep_ops=keep_trace),
        timings_s={},
    )
