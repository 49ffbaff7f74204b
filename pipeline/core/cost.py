"""The cost model: how long each strategy's backup, load-back and load from L3 should take on
a machine with these link speeds, and which link bounds each (plain data in, estimates out).

`estimate(case, ownership, links)` is the one entry point; `plan`, `explain`, `strategy=auto`
and the benches call it. The arithmetic, per rank of the first replica group (every group
moves the same bytes), with g ranks in the group:

- a rank's copy over its host link: `calls x copy_call_us + bytes / link`, where calls are the
  units it copies (one host call each, the per-transfer term that dominates small requests),
  bytes its units' pages, and the link the DMA one (io_backend=direct, or kernel on
  consecutive pages outside CUDA graphs) or the UVA kernels' (io_backend=kernel on fragmented
  pages or in graphs: they gather and scatter through the SMs);
- a broadcast of every exchanged unit from its owner: bytes / broadcast (algorithm bandwidth;
  the inter-node link where the group spans nodes);
- a dedup load: with DMA copies the broadcasts overlap the next layers' copies, so
  max(copy, exchange) plus one unit's exchange at the end; with UVA kernels they were measured
  not to overlap (BENCHMARKS.md), so copy + exchange;
- a load from L3: every reading rank's bytes / min(one reader, aggregate / readers), then
  the last window's load (the earlier windows' loads run under the next reads).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

from pipeline.core.checks import Problem, raise_problems
from pipeline.core.model import ModelGeometry, Unit
from pipeline.core.ownership import OwnerMap, Ownership, owner_map
from pipeline.core.storage import StorageKind
from pipeline.core.topology import IoBackend, Topology

GB = 1e9
"""Link speeds are in GB/s of 1e9 bytes, as the benches print them."""
Owned = dict[int, tuple[Unit, ...]]
"""Each rank of a replica group -> the units it copies."""


GBPS_RANGE = (0.001, 10_000.0)
"""Link speeds the cost model takes, GB/s: 1 MB/s (below any disk) to 10 TB/s (beyond any
link): a speed of 1e-300 printed estimates hundreds of digits long."""
CALL_US_RANGE = (0.001, 100_000.0)
"""Host microseconds to issue one copy: 1 ns to 0.1 s (measured: 8 us on CPU ranks)."""


def link_range(name: str) -> tuple[float, float, str]:
    """(least, most, unit) of a Links field."""
    return (*CALL_US_RANGE, "us") if name == "copy_call_us" else (*GBPS_RANGE, "GB/s")


@dataclass(frozen=True, kw_only=True)
class Links:
    """One machine's link speeds, what the cost model reads (`runtime.links`)."""

    machine: str
    """What these figures describe (a preset's name, or what `bench bench=links` ran on)."""
    h2d_gbps: float
    """Pinned host -> device DMA per GPU, every GPU copying at once."""
    d2h_gbps: float
    """Device -> pinned host DMA per GPU, every GPU copying at once."""
    h2d_kernel_gbps: float
    """Host -> device through UVA gather kernels (io_backend=kernel)."""
    d2h_kernel_gbps: float
    """Device -> host through UVA scatter kernels (io_backend=kernel)."""
    broadcast_gbps: float
    """Device -> device broadcast within a node, algorithm bandwidth (bytes / time)."""
    internode_gbps: float
    """Broadcast bandwidth where a replica group spans nodes."""
    copy_call_us: float
    """Host time to issue one unit's copy (a transfer issues one per unit it copies)."""
    file_read_gbps: float
    """One rank reading and checking objects from a file store (its storage.io_threads)."""
    file_read_aggregate_gbps: float
    """Every rank of the node reading from the file store at once, together."""
    file_write_gbps: float
    """One writer's write-back into a file store."""
    mooncake_read_gbps: float
    """One rank reading objects from Mooncake Store."""
    mooncake_read_aggregate_gbps: float
    """Every rank reading from Mooncake Store at once, together."""
    mooncake_write_gbps: float
    """One writer's write-back into Mooncake Store."""

    def __post_init__(self) -> None:
        found = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "machine" or isinstance(value, bool):
                continue
            if not isinstance(value, int | float):
                continue  # left to the schema check
            low, high, unit = link_range(f.name)
            if not (math.isfinite(value) and low <= value <= high):
                message = f"{f.name}={value!r} must be a number > 0 (from {low} to {high} {unit})"
                found.append(Problem(f.name, message))
        raise_problems(found)

    def reads(self, store: StorageKind) -> tuple[float, float]:
        """(one reader, all readers together) of a store, GB/s."""
        if store is StorageKind.mooncake:
            return self.mooncake_read_gbps, self.mooncake_read_aggregate_gbps
        return self.file_read_gbps, self.file_read_aggregate_gbps

    def write(self, store: StorageKind) -> float:
        return self.mooncake_write_gbps if store is StorageKind.mooncake else self.file_write_gbps


@dataclass(frozen=True, kw_only=True)
class Case:
    """What one estimate is of: the model, the (normalized) topology and the workload."""

    model: ModelGeometry
    topology: Topology
    tokens: int
    """Tokens per backup and per load-back."""
    fragmented: bool = False
    """Pages at random ids (bench and run's workload.placement=fragmented)."""
    graphs: bool = False
    """Transfers replay CUDA graphs (strategy.cuda_graph_cache > 0 on cuda): the kernel
    backend then gathers even consecutive pages with kernels."""
    store: StorageKind = StorageKind.none
    hit_tokens: int | None = None
    """Tokens a load from L3 finds (None: all of them)."""
    window_pages: int = 0
    """Pages loaded to the device per window of a load from L3 (0: one window)."""


@dataclass(frozen=True)
class Leg:
    """One direction's estimate: seconds, and the link that bounds it."""

    seconds: float
    bound: str
    """h2d, d2h (DMA or kernel), broadcast, issue (the per-unit host calls), l3 read, l3 write."""
    terms: tuple[tuple[str, float], ...] = ()
    """The seconds of each term it adds up (the arithmetic `explain --json` shows)."""

    def as_dict(self) -> dict[str, object]:
        terms = {name: round(s * 1e3, 3) for name, s in self.terms}
        return {"ms": round(self.seconds * 1e3, 3), "bound": self.bound, "terms_ms": terms}


@dataclass(frozen=True)
class RankCost:
    """Bytes one rank moves per transfer (`plan` shows them per rank)."""

    rank: int
    host_link_bytes: int
    """Bytes over its host link per backup and per load-back (the same units both ways)."""
    broadcast_sent_bytes: int
    broadcast_received_bytes: int
    l3_read_bytes: int


@dataclass(frozen=True)
class Estimate:
    """One strategy's estimate on one case."""

    ownership: Ownership
    backup: Leg
    load: Leg
    l3_load: Leg | None
    """None without a store."""
    write_back: Leg | None
    ranks: tuple[RankCost, ...]

    @property
    def score(self) -> float:
        """What `strategy=auto` minimizes: the load-back a hit waits for (from L3 with a store)."""
        return (self.l3_load or self.load).seconds

    def as_dict(self) -> dict[str, object]:
        legs: dict[str, Leg | None] = {"backup": self.backup, "load": self.load}
        legs |= {"l3_load": self.l3_load, "write_back": self.write_back}
        out: dict[str, object] = {k: v.as_dict() if v else None for k, v in legs.items()}
        peak = max(self.ranks, key=lambda r: r.host_link_bytes)
        out["host_link_bytes_per_rank"] = peak.host_link_bytes
        out["l3_read_bytes_per_rank"] = max(r.l3_read_bytes for r in self.ranks)
        return out


def _pages(tokens: int, case: Case) -> int:
    """Pages of `tokens` one rank holds (DCP spreads them over dcp_size ranks)."""
    pages = -(-tokens // case.model.page_size)
    return -(-pages // case.topology.dcp_size)


def _bound(terms: dict[str, float]) -> Leg:
    """The sum of terms, named after the largest."""
    return Leg(sum(terms.values()), max(terms, key=lambda k: terms[k]), tuple(terms.items()))


def copy_leg(units: tuple[Unit, ...], pages: int, gbps: float, link: str, links: Links) -> Leg:
    """One rank copying `units` of `pages` pages over its host link."""
    issue = len(units) * links.copy_call_us * 1e-6
    return _bound({"issue": issue, link: sum(u.page_bytes for u in units) * pages / (gbps * GB)})


def estimate(case: Case, ownership: Ownership, links: Links) -> Estimate:
    """Every leg of one strategy on one case (see the module docstring for the arithmetic)."""
    t, units = case.topology, case.model.units
    group = t.replica_group(0, case.model)
    owners = owner_map(ownership, group, units)
    # the kernel backend copies consecutive pages with one DMA, except inside a graph
    kernel = t.io_backend is IoBackend.kernel and (case.fragmented or case.graphs)
    h2d, d2h = (
        (links.h2d_kernel_gbps, links.d2h_kernel_gbps)
        if kernel
        else (links.h2d_gbps, links.d2h_gbps)
    )
    tag = " kernel" if kernel else ""
    pages = _pages(case.tokens, case)
    owned = {r: owners.owned(r, units) for r in group}
    backup = max((copy_leg(owned[r], pages, d2h, "d2h" + tag, links) for r in group), key=_secs)
    copies = max((copy_leg(owned[r], pages, h2d, "h2d" + tag, links) for r in group), key=_secs)
    load = _load(copies, _exchange(case, owners, pages, links), kernel, len(units))
    ranks = _rank_costs(case, owners, owned, pages)
    l3_load = write_back = None
    if case.store is not StorageKind.none:
        l3_load = _l3_load(case, ownership, owners, owned, links)
        every = sum(u.page_bytes for u in units) * pages
        write_back = _bound({"l3 write": every / (links.write(case.store) * GB)})
    return Estimate(ownership, backup, load, l3_load, write_back, ranks)


def _secs(leg: Leg) -> float:
    return leg.seconds


def _exchange(case: Case, owners: OwnerMap, pages: int, links: Links) -> float:
    """Seconds to broadcast every exchanged unit once from its owner."""
    gbps = links.internode_gbps if case.topology.nnodes > 1 else links.broadcast_gbps
    moved = sum(u.page_bytes for u in case.model.units if owners.exchanged(u.ordinal))
    return moved * pages / (gbps * GB)


def _load(copies: Leg, exchange: float, kernel: bool, num_units: int) -> Leg:
    """A load-back: the copies and the exchange, overlapped only where the copies are DMA."""
    if exchange == 0:
        return copies
    if kernel:
        return _bound({**dict(copies.terms), "broadcast": exchange})
    tail = exchange / num_units  # the last unit's broadcast, after its copy
    terms = (*copies.terms, ("broadcast (overlapped)", exchange), ("last broadcast", tail))
    if exchange > copies.seconds:
        return Leg(exchange + tail, "broadcast", terms)
    return Leg(copies.seconds + tail, copies.bound, terms)


def _rank_costs(case: Case, owners: OwnerMap, owned: Owned, pages: int) -> tuple[RankCost, ...]:
    units = case.model.units
    found = []
    for r in owners.group:
        mine = sum(u.page_bytes for u in owned[r]) * pages
        sent = sum(u.page_bytes for u in owned[r] if owners.exchanged(u.ordinal)) * pages
        received = sum(
            u.page_bytes
            for u in units
            if owners.exchanged(u.ordinal) and owners.sources[u.ordinal] != r
        )
        reads = _reads(case, owned[r])
        found.append(RankCost(r, mine, sent, received * pages, reads))
    return tuple(found)


def _reads(case: Case, owned: tuple[Unit, ...]) -> int:
    """Bytes `rank` reads from L3 for a hit: its own units (single_source: the source reads all)."""
    if case.store is StorageKind.none:
        return 0
    pages = _pages(case.tokens if case.hit_tokens is None else case.hit_tokens, case)
    return sum(u.page_bytes for u in owned) * pages


def _l3_load(case: Case, ownership: Ownership, owners: OwnerMap, owned: Owned, links: Links) -> Leg:
    """Reads by every reading rank of the stage at once, then the last window's load."""
    hit = case.tokens if case.hit_tokens is None else case.hit_tokens
    reads = [_reads(case, owned[r]) for r in owners.group]
    groups = len(case.topology.replica_groups(case.model))
    readers = groups * sum(1 for b in reads if b)
    one, together = links.reads(case.store)
    read_s = max(reads) / (min(one, together / readers) * GB)
    hit_case = dataclasses.replace(case, tokens=hit, store=StorageKind.none)
    load = estimate(hit_case, ownership, links).load
    pages = _pages(hit, case)
    windows = max(1, -(-pages // case.window_pages)) if case.window_pages else 1
    return _bound({"l3 read": read_s, f"last window's load ({load.bound})": load.seconds / windows})
