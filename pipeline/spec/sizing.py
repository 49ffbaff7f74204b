"""How big one rank's pools and staging buffers are, from the model, topology and knobs.

The engine allocates exactly these sizes and `plan` reports them, so what `plan` says a rank
holds is what a run allocates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from pipeline.spec.checks import LARGEST_NUMBER
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
    budget = host_budget(host_ratio, device_pages * sum(u.page_bytes for u in model.units))
    host = host_capacity(model, owners, rank, budget, keep_capacity)
    return Sizing(device_pages, host, slots_per_page)


DEFAULT_HOST_RATIO = 2.0
"""The host budget when neither workload.host_ratio nor workload.host_bytes is given."""
UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A size in bytes from `4096`, `64GiB`, `1.5 KiB` or `2MB` (KB, MB...: powers of 1000;
    KiB, MiB...: of 1024); ValueError unless a whole number from 1 to 1e15."""
    found = SIZE.fullmatch(text)
    if found is None or (found.group(3) and not found.group(2)):
        raise ValueError(text)
    number, prefix, binary = Fraction(found.group(1)), found.group(2).lower(), found.group(3)
    size = number * (1024 ** ("kmgt".index(prefix) + 1) if binary else UNITS[prefix])
    if size.denominator != 1 or not 1 <= size <= LARGEST_NUMBER:
        raise ValueError(text)
    return int(size)


def host_budget(host_ratio: float, device_pool_bytes: int) -> int:
    """Bytes of a rank's host budget: host_ratio x the device pool's bytes (all its units)."""
    return int(host_ratio * device_pool_bytes)


def ratio_for_bytes(host_bytes: int, device_pool_bytes: int) -> float:
    """The host_ratio whose budget over a device pool of these bytes is exactly `host_bytes`
    (the engine takes its budget as a ratio: the float is nudged until `host_budget` agrees,
    which it can for any pool and budget below 2**52 bytes)."""
    if device_pool_bytes == 0:
        return 0.0  # no ratio of nothing is a budget: an empty pool has none
    ratio = host_bytes / device_pool_bytes
    for _ in range(8):
        budget = host_budget(ratio, device_pool_bytes)
        if budget == host_bytes:
            return ratio
        ratio = math.nextafter(ratio, math.inf if budget < host_bytes else 0.0)
    raise AssertionError(f"no ratio gives {host_bytes} B over {device_pool_bytes} B")


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
