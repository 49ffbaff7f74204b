"""The pools and buffers of one rank's engine, made once when it is created."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pipeline.core.model import ModelGeometry
from pipeline.core.ownership import OwnerMap
from pipeline.core.sizing import Sizing, batch_buffer_bytes, exchange_staging_bytes
from pipeline.core.strategy import StrategyConfig
from pipeline.core.topology import Topology
from pipeline.engine.cuda.page_ids import PageIdBuffers
from pipeline.engine.runtime import Runtime
from pipeline.engine.transfer.pools import DevicePool, HostPool, uva_alias
from pipeline.engine.transfer.state import Resources, Trace


def allocate(
    runtime: Runtime,
    model: ModelGeometry,
    topology: Topology,
    config: StrategyConfig,
    owners: OwnerMap,
    sizing: Sizing,
    uva: bool,
    keep_trace: bool,
    device_kv: Mapping[tuple[str, int], torch.Tensor] | None,
) -> Resources:
    """The pools and buffers of one rank's engine (`uva`: kernels reach the host pool through
    its UVA alias; `device_kv`: the caller's KV tensors, adopted as the device pool)."""
    rank, device = runtime.rank, runtime.device
    device_pool = _device_pool(model, sizing, device, device_kv)
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
        device_pool=device_pool,
        host_pool=host_pool,
        host_view=host_view,
        collectives=runtime.collectives,
        copy_pages=runtime.copy_pages,
        copy_stacks=runtime.copy_stacks,
        move_pages=runtime.move_pages,
        upload=runtime.upload,
        page_id_buffers=(
            PageIdBuffers(device, min(sizing.host.num_pages, sizing.device_pages))
            if device.type == "cuda"
            else None
        ),
        staging=device_bytes(exchange_staging_bytes(config, model, owners)),
        batch_buffers=device_bytes(batch_buffer_bytes(config, topology, model, owners, rank), 2),
        gather_stream=runtime.gather_stream,
        trace=Trace(keep_ops=keep_trace),
        timings_s={},
    )


def _device_pool(
    model: ModelGeometry,
    sizing: Sizing,
    device: torch.device,
    device_kv: Mapping[tuple[str, int], torch.Tensor] | None,
) -> DevicePool:
    """A new device pool, or the caller's KV tensors adopted as one, of the sized pages."""
    pool = (
        DevicePool.allocate(model, sizing.device_pages, device)
        if device_kv is None
        else DevicePool.adopt(model, device_kv, device)
    )
    if pool.num_pages != sizing.device_pages:
        raise ValueError(
            f"device_kv holds {pool.num_pages} pages but workload.device_tokens gives "
            f"{sizing.device_pages}: set it to pages x page_size x dcp_size"
        )
    return pool
