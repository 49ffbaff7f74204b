"""TransferPlan: the frozen spec of one transfer on one rank (pages, steps, who moves what).

`build_plan` validates the caller's indices once (page-aligned, in range, equal lengths, no
duplicates) and raises ValueError before any byte moves. What a stage needs to know of the
transfer is decided here, once, on the host: the steps (chunked or not), which go through a
batch buffer, which exchange lands in place. Stages consume the plan, never re-derive it."""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import torch

from pipeline.core.model import ModelGeometry, Unit
from pipeline.core.ownership import OwnerMap, Role
from pipeline.core.runs import Run, breaks, clip, runs_of
from pipeline.core.sizing import Sizing, batch_buffer_bytes, gathers_batches
from pipeline.core.slots import page_rows
from pipeline.core.steps import Step, StepLayout, backup_steps, load_steps
from pipeline.core.strategy import StrategyConfig
from pipeline.core.topology import IoBackend, MemLayout, Topology


class Direction(Enum):
    """backup: device -> host; load: host -> device."""

    backup = "backup"
    load = "load"


@dataclass(frozen=True)
class PlanSpec:
    """What every transfer plan of one rank shares: the units and who copies them, the page
    geometry and pool sizes, and the knobs that shape steps (made once per engine)."""

    rank: int
    units: tuple[Unit, ...]
    owners: OwnerMap
    page_size: int
    dcp_size: int
    host_slots: int
    device_slots: int
    io_backend: IoBackend
    mem_layout: MemLayout
    staging_bytes: int
    """Largest exchange slice and chunked-backup batch (strategy.staging_bytes)."""
    chunk_pages: int
    """Backups in batches of this many pages; 0 is one batch (strategy.chunk_pages)."""
    load_group_bytes: int
    """Least bytes a load's group of unexchanged layers moves (strategy.load_group_bytes)."""
    batch_buffer_bytes: int
    """Each of the two device buffers a chunked backup's batches gather into (0: none)."""
    pools_stack: bool = True
    """Both pools keep each pool kind's units evenly spaced in one buffer, as the engine
    allocates them; adopted KV of one tensor per layer does not, and its batches are copied
    unit by unit instead of gathered."""

    @classmethod
    def of(
        cls,
        model: ModelGeometry,
        topology: Topology,
        strategy: StrategyConfig,
        sizing: Sizing,
        rank: int,
    ) -> PlanSpec:
        owners = sizing.owners
        return cls(
            rank=rank,
            units=model.units,
            owners=owners,
            page_size=model.page_size,
            dcp_size=topology.dcp_size,
            host_slots=sizing.host_slots,
            device_slots=sizing.device_slots,
            io_backend=topology.io_backend,
            mem_layout=topology.mem_layout,
            staging_bytes=strategy.staging_bytes,
            chunk_pages=strategy.chunk_pages,
            load_group_bytes=strategy.load_group_bytes,
            batch_buffer_bytes=batch_buffer_bytes(strategy, topology, model, owners, rank),
        )

    @property
    def slots_per_page(self) -> int:
        return self.page_size * self.dcp_size

    def copies(self, unit: Unit) -> bool:
        """Does this rank copy `unit` between its own device and host pools?"""
        return self.owners.copies(unit.ordinal, self.rank)

    @functools.cached_property
    def copied(self) -> frozenset[int]:
        """Ordinals of the units this rank copies (`copies` as a set, for the issue path)."""
        return frozenset(u.ordinal for u in self.units if self.copies(u))

    @functools.cached_property
    def roles(self) -> tuple[Role, ...]:
        """By unit ordinal: this rank's part in a load-back's exchange of the unit."""
        return tuple(self.owners.role(u.ordinal, self.rank) for u in self.units)

    def lay_out(
        self, direction: Direction, num_pages: int, breaks: frozenset[int] = frozenset()
    ) -> StepLayout:
        """The steps of a transfer of `num_pages` pages (and of a load's `breaks`: the
        layers that start a group of its steps)."""
        if direction is Direction.load:
            exchanged = functools.partial(_exchanged, self.owners)
            sizes = {"staging_bytes": self.staging_bytes, "group_bytes": self.load_group_bytes}
            steps = load_steps(self.units, exchanged, num_pages, **sizes, breaks=breaks)
            return StepLayout.of(steps)
        # a batch buffer holds what a page_first_direct host takes in one DMA per run of
        # pages (it keeps a page's units together); a kernel moves a batch in one launch
        one_call = self.pools_stack and gathers_batches(self.io_backend, self.mem_layout)
        copied = tuple(u for u in self.units if self.copies(u))
        steps = backup_steps(
            copied,
            num_pages,
            chunk_pages=self.chunk_pages,
            batch_bytes=self.staging_bytes,
            buffer_bytes=self.batch_buffer_bytes,
            one_call_batches=one_call,
        )
        return StepLayout.of(steps)


def _exchanged(owners: OwnerMap, unit: Unit) -> bool:
    return owners.exchanged(unit.ordinal)


@dataclass(frozen=True)
class TransferPlan:
    """One transfer on one rank: its validated pages, its steps and who moves each unit."""

    direction: Direction
    spec: PlanSpec
    host_indices: torch.Tensor
    """Logical host slots, as the caller passed them (CPU int64)."""
    device_indices: torch.Tensor
    """Logical device slots, as the caller passed them (CPU int64)."""
    page_rows: np.ndarray
    """[host pages, device pages]: the local host and device page of each transfer page
    (int64, one array for one upload of the ids; numpy, as everything that reads it on the
    issue path takes it)."""
    layout: StepLayout
    graphed: bool = False
    """Issued as a CUDA graph replay: no step may depend on page ids (no in-place exchange)."""
    verify: bool = False
    """After the load, check across the replica group that every rank holds the same bytes."""
    _runs_in: dict[tuple[int, int], tuple[Run, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.layout.steps

    def layer_steps(self, layer: int) -> tuple[Step, ...]:
        return self.layout.by_layer[layer]

    @functools.cached_property
    def host_pages(self) -> np.ndarray:
        """Local host page of each transfer page (int64)."""
        return self.page_rows[0]

    @functools.cached_property
    def device_pages(self) -> np.ndarray:
        """Local device page of each transfer page (int64)."""
        return self.page_rows[1]

    @functools.cached_property
    def num_pages(self) -> int:
        return self.page_rows.shape[1]

    @property
    def num_tokens(self) -> int:
        return len(self.host_indices)

    @functools.cached_property
    def _breaks(self) -> np.ndarray:
        return breaks(self.host_pages, self.device_pages)

    @functools.cached_property
    def consecutive(self) -> bool:
        """All pages are one run (without making the runs: a fragmented transfer has many)."""
        return not len(self._breaks)

    @functools.cached_property
    def host_first(self) -> int | None:
        """The first host page if they are one run (kernels move it in place), not in graphs."""
        hosts = self.host_pages
        one_run = not self.graphed and (hosts[1:] - hosts[:-1] == 1).all()
        return int(hosts[0]) if one_run else None

    @functools.cached_property
    def device_first(self) -> int | None:
        """The first device page where both sides are one run (on CPU: one strided copy)."""
        return None if self.graphed or not self.consecutive else int(self.device_pages[0])

    @functools.cached_property
    def runs(self) -> tuple[Run, ...]:
        """Maximal runs of pages consecutive on both sides (made when first asked for: the
        kernel backend inside a CUDA graph never asks)."""
        return runs_of(self.host_pages, self.device_pages, self._breaks)

    def runs_in(self, first: int, count: int) -> tuple[Run, ...]:
        """The runs clipped to pages [first, first + count) (once per slice and transfer)."""
        key = (first, count)
        if key not in self._runs_in:
            self._runs_in[key] = clip(self.runs, first, first + count)
        return self._runs_in[key]

    def device_run(self, step: Step) -> int | None:
        """The first device page when the step's pages lie in one run, else None (O(log n))."""
        run = self.runs[bisect.bisect_right(self.runs, step.first, key=lambda r: r.first) - 1]
        if step.first + step.count > run.first + run.pages:
            return None
        return run.device_page + step.first - run.first

    def in_place(self, step: Step) -> int | None:
        """Where an exchanged step's broadcast lands in place (its first device page), or None
        through the staging buffer (pages apart, or a graph, which must not bake in ids)."""
        return None if self.graphed else self.device_run(step)

    def copies(self, unit: Unit) -> bool:
        return self.spec.copies(unit)

    def role(self, unit: Unit) -> Role:
        """This rank's part in `unit`'s exchange (none in a backup): decided here, once per
        engine, and read by the exchange stages and `plan` alike."""
        return self.spec.roles[unit.ordinal] if self.direction is Direction.load else Role.none

    def exchanged(self, unit: Unit) -> bool:
        """Is `unit` broadcast from its owner to the replica group in this transfer?"""
        return self.role(unit) is not Role.none

    def source(self, unit: Unit) -> int:
        source = self.spec.owners.sources[unit.ordinal]
        assert source is not None, "only exchanged units have a source"
        return source

    def bytes_moved(self) -> dict[str, int]:
        """Bytes this rank copies between tiers and sends/receives in broadcasts."""
        copied = send = recv = 0
        for s in self.steps:
            copied += s.nbytes if self.copies(s.unit) else 0
            role = self.role(s.unit)
            send += s.nbytes if role is Role.send else 0
            recv += s.nbytes if role is Role.receive else 0
        key = "d2h_bytes" if self.direction is Direction.backup else "h2d_bytes"
        return {key: copied, "broadcast_send_bytes": send, "broadcast_recv_bytes": recv}


class StepsCache:
    """Step layouts per (direction, page count, breaks) of one engine, the latest kept."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._layouts: dict[tuple[bool, int, frozenset[int]], StepLayout] = {}

    def get(
        self, spec: PlanSpec, direction: Direction, num_pages: int, breaks: frozenset[int]
    ) -> StepLayout:
        key = (direction is Direction.load, num_pages, breaks)  # an enum's hash: a Python call
        if (layout := self._layouts.get(key)) is None:
            layout = self._layouts[key] = spec.lay_out(direction, num_pages, breaks)
            if len(self._layouts) > self.capacity:
                del self._layouts[next(iter(self._layouts))]
        return layout


def build_plan(
    direction: Direction,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    spec: PlanSpec,
    *,
    graphed: bool = False,
    verify: bool = False,
    known_steps: StepsCache | None = None,
    breaks: frozenset[int] = frozenset(),
) -> TransferPlan:
    """Validate logical indices and lay out the steps (`known_steps`: an engine's, laid out
    once per page count; `breaks`: `PlanSpec.lay_out`'s); raises ValueError on bad input."""
    rows = page_rows(
        host_indices, device_indices, spec.slots_per_page, spec.host_slots, spec.device_slots
    )
    num_pages = rows.shape[1]
    layout = (
        spec.lay_out(direction, num_pages, breaks)
        if known_steps is None
        else known_steps.get(spec, direction, num_pages, breaks)
    )
    return TransferPlan(
        direction, spec, host_indices, device_indices, rows, layout, graphed=graphed, verify=verify
    )
