"""How big one rank's pools and staging buffers are, from the model, topology and knobs.

`size_rank` is the one sizing: the engine allocates exactly it, `plan` reports it and the
parent checks it before a rank starts, so what `plan` says a rank holds is what a run
allocates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from pipeline.core.checks import LARGEST_NUMBER, Problem
from pipeline.core.model import ModelGeometry, by_pool_kind
from pipeline.core.ownership import OwnerMap, owner_map
from pipeline.core.strategy import StrategyConfig
from pipeline.core.topology import IoBackend, MemLayout, Topology


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
    owners: OwnerMap
    """Who copies and who sends each unit in the rank's replica group (sizes follow it)."""

    @property
    def device_slots(self) -> int:
        return self.device_pages * self.slots_per_page

    @property
    def host_slots(self) -> int:
        return self.host.num_pages * self.slots_per_page


def size_rank(
    model: ModelGeometry,
    topology: Topology,
    strategy: StrategyConfig,
    rank: int,
    budget: PoolBudget,
) -> Sizing:
    """One rank's pools: device pages from the budget's tokens, host pages that fit its host
    budget (see `host_capacity`), for the owners the strategy gives the rank's group."""
    owners = owner_map(strategy.ownership, topology.replica_group(rank, model), model.units)
    slots_per_page = model.page_size * topology.dcp_size
    if budget.device_tokens % slots_per_page:
        raise ValueError(
            f"workload.device_tokens={budget.device_tokens} must be a multiple of "
            f"page_size x dcp_size = {slots_per_page}"
        )
    device_pages = budget.device_tokens // slots_per_page
    host_bytes = budget.host_budget(device_pages * sum(u.page_bytes for u in model.units))
    host = host_capacity(model, owners, rank, host_bytes, strategy.keep_capacity)
    return Sizing(device_pages, host, slots_per_page, owners)


def capacity_problems(
    sizing: Sizing, *, num_tokens: int, device_tokens: int, host_key: str
) -> list[Problem]:
    """A transfer of `num_tokens` that these pools cannot hold: the device pool holds the
    backup's source and the load's target, the host pool the transfer."""
    pages = num_tokens // sizing.slots_per_page
    found = []
    if 2 * pages > sizing.device_pages:
        message = (
            f"workload.device_tokens={device_tokens} must hold twice workload.num_tokens="
            f"{num_tokens} (backup source + load target)"
        )
        found.append(Problem("workload.device_tokens", message))
    if pages > sizing.host.num_pages:
        message = (
            f"the host pool holds {sizing.host_slots} tokens < workload.num_tokens="
            f"{num_tokens}; raise {host_key}"
        )
        found.append(Problem(host_key, message))
    return found


DEFAULT_HOST_RATIO = 2.0
"""The host budget when neither workload.host_ratio nor workload.host_bytes is given."""


@dataclass(frozen=True)
class PoolBudget:
    """What one rank's pools may hold: the device pool in tokens; the host pool as a ratio of
    the device pool's bytes or, when given, in bytes (the same whatever the device pool, so
    an adopted pool of another size keeps it)."""

    device_tokens: int
    host_ratio: float = DEFAULT_HOST_RATIO
    host_bytes: int | None = None

    def host_budget(self, device_pool_bytes: int) -> int:
        """Bytes of the host budget over a device pool of these bytes (all its units)."""
        if self.host_bytes is not None:
            return self.host_bytes
        return int(self.host_ratio * device_pool_bytes)


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
    strategy: StrategyConfig, topology: Topology, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Bytes of one of the two buffers a chunked backup gathers its batches into: one batch
    of the widest pool kind this rank copies, at most `staging_bytes`. Only `direct` copies
    to a page_first_direct host gather (its DMAs need a page's units together); a kernel
    moves a batch from the device pages to the host in one launch. 0 when not chunked."""
    if strategy.chunk_pages <= 0 or not gathers_batches(topology.io_backend, topology.mem_layout):
        return 0
    kinds = by_pool_kind(owners.owned(rank, model.units))
    widest = max((sum(u.page_bytes for u in units) for units in kinds), default=0)
    return min(strategy.chunk_pages * widest, strategy.staging_bytes)


def gathers_batches(io_backend: IoBackend, mem_layout: MemLayout) -> bool:
    """Whether a chunked backup's batches go through the batch buffers: direct copies to a
    page_first_direct host, which takes a batch gathered page-major in one DMA per run."""
    return io_backend is IoBackend.direct and mem_layout is MemLayout.page_first_direct


def device_staging_bytes(
    strategy: StrategyConfig, topology: Topology, model: ModelGeometry, owners: OwnerMap, rank: int
) -> int:
    """Device memory a rank's engine holds besides its pool: the exchange buffer and the two
    batch buffers."""
    exchange = exchange_staging_bytes(strategy, model, owners)
    return exchange + 2 * batch_buffer_bytes(strategy, topology, model, owners, rank)
