"""How big one rank's pools and staging buffers are, from the model, topology and knobs.

The engine allocates exactly these sizes and `plan` reports them, so what `plan` says a rank
holds is what a run allocates.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.spec.model import ModelGeometry, by_pool_kind
from pipeline.spec.ownership import OwnerMap
from pipeline.spec.strategy import StrategyConfig
from pipeline.spec.topology import Topology


@dataclass(frozen=True)
class HostCapacity:
    """Host pool sizing of one rank."""

    num_pages: int
    """Pages of host slots (identical on every rank of the group)."""
    pool_bytes: int
    """Bytes this rank's host pool occupies (owned units only)."""


def host_capacity(
    model: ModelGeometry, owners: OwnerMap, rank: int, budget_bytes: int, keep_capacity: bool
) -> HostCapacity:
    """Pages that fit the budget; sharded pools fit more, or keep capacity and use less.

    The page count must be the same on every rank of the group (host slots are allocated
    identically everywhere), so it is sized for the group member that owns the most bytes.
    """
    units = model.units
    everyone = 0  # bytes every rank holds (replicated units)
    by_owner: dict[int, int] = {}  # bytes of the units only their owner holds
    for u in units:
        source = owners.sources[u.ordinal]
        if source is None:
            everyone += u.page_bytes
        else:
            by_owner[source] = by_owner.get(source, 0) + u.page_bytes
    widest = everyone + max(by_owner.values(), default=0)
    per_page = sum(u.page_bytes for u in units) if keep_capacity else widest
    num_pages = budget_bytes // per_page
    return HostCapacity(num_pages, num_pages * (everyone + by_owner.get(rank, 0)))


@dataclass(frozen=True)
class Sizing:
    """Pool sizes of one rank, in local pages (a local page is page_size rows)."""

    device_pages: int
    host: HostCapacity
    slots_per_page: int
    """Logical slots per page: page_size x dcp_size."""

    @property
    def device_slots(self) -> int:
        return self.device_pages * self.slots_per_page

    @property
    def host_slots(self) -> int:
        return self.host.num_pages * self.slots_per_page


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
    slots_per_page = model.page_size * topology.dcp_size
    if device_tokens % slots_per_page:
        raise ValueError(
            f"workload.device_tokens={device_tokens} must be a multiple of "
            f"page_size x dcp_size = {slots_per_page}"
        )
    device_pages = device_tokens // slots_per_page
    budget = int(host_ratio * device_pages * sum(u.page_bytes for u in model.units))
    host = host_capacity(model, owners, rank, budget, keep_capacity)
    return Sizing(device_pages, host, slots_per_page)


def exchange_staging_bytes(strategy: StrategyConfig, model: ModelGeometry, owners: OwnerMap) -> int:
    """Bytes of the buffer a load's exchanges gather into and broadcast from (0 without
    exchanged units); ValueError when one page of an exchanged unit does not fit."""
    exchanged = [u for u in model.units if owners.exchanged(u.ordinal)]
    if not exchanged:
        return 0
    widest_page = max(u.page_bytes for u in exchanged)
    if widest_page > strategy.staging_bytes:
        raise ValueError(
            f"strategy.staging_bytes={strategy.staging_bytes} is smaller than one page of a "
            f"layer ({widest_page} B); raise it"
        )
    return strategy.staging_bytes


def batch_buffer_bytes(
    strategy: StrategyConfig, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Bytes of one of the two buffers a chunked backup gathers its batches into: one batch
    of the widest pool kind this rank copies, at most `staging_bytes` (0 when not chunked)."""
    if strategy.chunk_pages <= 0:
        return 0
    kinds = by_pool_kind(owners.owned(rank, model.units))
    widest = max((sum(u.page_bytes for u in units) for units in kinds), default=0)
    return min(strategy.chunk_pages * widest, strategy.staging_bytes)


def device_staging_bytes(
    strategy: StrategyConfig, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Device memory a rank's engine holds besides its pool: the exchange buffer and the two
    batch buffers."""
    exchange = exchange_staging_bytes(strategy, model, owners)
    return exchange + 2 * batch_buffer_bytes(strategy, model, owners, rank)
