"""TransferPlan: the frozen spec of one transfer on one rank (pages, units, owners, steps, bytes).

`build_plan` validates the caller's indices once (page-aligned, in range, equal lengths, no
duplicates) and raises ValueError before any byte moves. Stages consume the plan; they never
re-derive it. Everything here runs on CPU tensors: the plan is the host-side decision.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

from pipeline.ownership import OwnerMap
from pipeline.topology import IoBackend, MemLayout, Unit, by_pool_kind


class Direction(Enum):
    backup = "backup"
    load = "load"


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive transfer pages that are consecutive on both the host and the device side."""

    first: int
    """Position of the run's first page in the transfer."""
    host_page: int
    device_page: int
    count: int


@dataclass(frozen=True, slots=True)
class Step:
    """One unit over a slice of the transfer's pages: the grain a per-step stage works on."""

    unit: Unit
    first: int
    """Position of the first page of the slice in the transfer."""
    count: int
    last_in_layer: bool
    """The last step of its model layer: the layer is complete after it (load)."""
    batch: tuple[Unit, ...] = ()
    """Chunked backups: every unit of `unit`'s pool kind this rank copies (`unit` first),
    whose pages of the slice move in one copy call. Empty: `unit` alone."""

    @property
    def units(self) -> tuple[Unit, ...]:
        return self.batch or (self.unit,)

    @property
    def nbytes(self) -> int:
        """Bytes of the step's pages of all its units."""
        return self.count * sum(u.page_bytes for u in self.units)


@dataclass(frozen=True)
class TransferPlan:
    direction: Direction
    rank: int
    page_size: int
    """Tokens per page on this rank (the widened page is page_size x dcp_size logical slots)."""
    dcp_size: int
    dcp_rank: int
    host_indices: torch.Tensor
    """Logical host slots, as the caller passed them (CPU int64)."""
    device_indices: torch.Tensor
    """Logical device slots, as the caller passed them (CPU int64)."""
    host_pages: torch.Tensor
    """Local host page of each transfer page (CPU int64)."""
    device_pages: torch.Tensor
    """Local device page of each transfer page (CPU int64)."""
    units: tuple[Unit, ...]
    owners: OwnerMap
    io_backend: IoBackend
    steps: tuple[Step, ...]

    @functools.cached_property
    def num_pages(self) -> int:
        return len(self.host_pages)

    @functools.cached_property
    def runs(self) -> tuple[Run, ...]:
        """Maximal runs of pages consecutive on both sides (made when first asked for: the
        kernel backend inside a CUDA graph never asks)."""
        hosts, devices = self.host_pages.numpy(), self.device_pages.numpy()
        breaks = np.flatnonzero((np.diff(hosts) != 1) | (np.diff(devices) != 1)) + 1
        bounds = [0, *breaks.tolist(), self.num_pages]
        spans = list(itertools.pairwise(bounds))
        hp, dp = hosts[bounds[:-1]].tolist(), devices[bounds[:-1]].tolist()
        return tuple(Run(a, h, d, b - a) for (a, b), h, d in zip(spans, hp, dp, strict=True))

    @property
    def num_tokens(self) -> int:
        return len(self.host_indices)

    def copies(self, unit: Unit) -> bool:
        return self.owners.copies(unit.ordinal, self.rank)

    def exchanged(self, unit: Unit) -> bool:
        return self.direction is Direction.load and self.owners.exchanged(unit.ordinal)

    def source(self, unit: Unit) -> int:
        source = self.owners.sources[unit.ordinal]
        assert source is not None, "only exchanged units have a source"
        return source

    def runs_in(self, first: int, count: int) -> list[Run]:
        """The runs clipped to pages [first, first + count) of the transfer."""
        end = first + count
        clipped = []
        start = bisect.bisect_right(self.runs, first, key=lambda r: r.first) - 1
        for r in self.runs[max(start, 0) :]:
            if r.first >= end:
                break
            lo, hi = max(r.first, first), min(r.first + r.count, end)
            if lo < hi:
                shift = lo - r.first
                clipped.append(Run(lo, r.host_page + shift, r.device_page + shift, hi - lo))
        return clipped

    def device_run(self, step: Step) -> int | None:
        """The first device page when the step's pages lie in one run, else None (O(log n))."""
        run = self.runs[bisect.bisect_right(self.runs, step.first, key=lambda r: r.first) - 1]
        if step.first + step.count > run.first + run.count:
            return None
        return run.device_page + step.first - run.first

    def chunked(self, chunk_pages: int, batch_bytes: int) -> tuple[Step, ...]:
        """Backup steps in batches of `chunk_pages` pages: per batch one step per pool kind,
        over the units of that kind this rank copies (a few large copies per batch, not one
        small copy per layer), split where a step would move more than `batch_bytes`."""
        if chunk_pages <= 0:
            return self.steps
        kinds = by_pool_kind(u for u in self.units if self.copies(u))
        steps = []
        for first in range(0, self.num_pages, chunk_pages):
            count = min(chunk_pages, self.num_pages - first)
            for units in kinds:
                per = max(1, batch_bytes // (count * units[0].page_bytes))
                for i in range(0, len(units), per):
                    batch = units[i : i + per]
                    steps.append(Step(batch[0], first, count, True, batch))
        return tuple(steps)

    def gathers_batch(self, step: Step, buffer_bytes: int, layout: MemLayout) -> bool:
        """Does a backup step go through a batch buffer of `buffer_bytes` (see `stages.copy`)?
        Where it covers several units, fits the buffer, and the host takes it in one call: a
        scatter kernel, or a DMA per run where the host keeps a page's units together."""
        return (
            self.direction is Direction.backup
            and len(step.units) > 1
            and step.nbytes <= buffer_bytes
            and (self.io_backend is IoBackend.kernel or layout is MemLayout.page_first_direct)
        )

    def copy_ops(self, step: Step, gathered: bool = False) -> int:
        """Copy calls a step issues on this rank where its pools stack its units: one
        (kernel), or per run the fewer of one per unit and one per page (direct); one per run
        when the batch was gathered into a batch buffer first (`gathered`, see `stages.copy`)."""
        if not self.copies(step.unit):
            return 0
        if self.io_backend is IoBackend.kernel:
            return 1
        runs = self.runs_in(step.first, step.count)
        if gathered:
            return len(runs)
        return sum(min(len(step.units), r.count) for r in runs)

    def bytes_moved(self) -> dict[str, int]:
        """Bytes this rank copies between tiers and sends/receives in broadcasts."""
        copied = send = recv = 0
        for s in self.steps:
            copied += s.nbytes if self.copies(s.unit) else 0
            if self.exchanged(s.unit):
                send += s.nbytes if self.source(s.unit) == self.rank else 0
                recv += s.nbytes if self.source(s.unit) != self.rank else 0
        key = "d2h_bytes" if self.direction is Direction.backup else "h2d_bytes"
        return {key: copied, "broadcast_send_bytes": send, "broadcast_recv_bytes": recv}


class StepsCache:
    """Steps per (direction, page count) of one engine, the `capacity` latest kept."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._steps: dict[tuple[Direction, int], tuple[Step, ...]] = {}

    def get(self, key: tuple[Direction, int]) -> tuple[Step, ...] | None:
        return self._steps.get(key)

    def put(self, key: tuple[Direction, int], steps: tuple[Step, ...]) -> None:
        self._steps[key] = steps
        if len(self._steps) > self.capacity:
            del self._steps[next(iter(self._steps))]


def build_plan(
    direction: Direction,
    host_indices: torch.Tensor,
    device_indices: torch.Tensor,
    *,
    rank: int,
    units: tuple[Unit, ...],
    owners: OwnerMap,
    page_size: int,
    dcp_size: int,
    dcp_rank: int,
    host_slots: int,
    device_slots: int,
    io_backend: IoBackend,
    staging_bytes: int,
    known_steps: StepsCache | None = None,
) -> TransferPlan:
    """Validate logical indices and lay out the steps; raises ValueError on bad input.

    Steps depend only on the page count once the rest is fixed (one engine), so an engine
    passes `known_steps` to lay them out once per page count."""
    widened = page_size * dcp_size
    host_pages = _pages("host_indices", host_indices, widened, host_slots)
    device_pages = _pages("device_indices", device_indices, widened, device_slots)
    if len(host_indices) != len(device_indices):
        raise ValueError(
            f"host_indices has {len(host_indices)} slots and device_indices "
            f"{len(device_indices)}: pass one device slot per host slot"
        )
    plan_with = functools.partial(
        TransferPlan,
        direction=direction,
        rank=rank,
        page_size=page_size,
        dcp_size=dcp_size,
        dcp_rank=dcp_rank,
        host_indices=host_indices,
        device_indices=device_indices,
        host_pages=host_pages,
        device_pages=device_pages,
        units=units,
        owners=owners,
        io_backend=io_backend,
    )
    key = (direction, len(host_pages))
    steps = known_steps.get(key) if known_steps is not None else None
    if steps is None:
        steps = _steps(plan_with(steps=()), staging_bytes)
        if known_steps is not None:
            known_steps.put(key, steps)
    return plan_with(steps=steps)


def _steps(plan: TransferPlan, staging_bytes: int) -> tuple[Step, ...]:
    """The steps of a plan laid out without them (see `build_plan`)."""
    if plan.direction is Direction.backup:  # each copied unit over every page
        copied = [u for u in plan.units if plan.copies(u)]
        return tuple(Step(u, 0, plan.num_pages, last_in_layer=True) for u in copied)
    return _load_steps(plan, staging_bytes)


def _pages(name: str, indices: torch.Tensor, widened: int, num_slots: int) -> torch.Tensor:
    """Page ids of whole, aligned pages; every malformed input gets a ValueError naming it."""
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of slot indices")
    if indices.device.type != "cpu" or indices.dtype != torch.int64:
        raise ValueError(
            f"{name} must be a CPU int64 tensor (got {indices.dtype} on "
            f"{indices.device}): plans are computed on the host"
        )
    n = len(indices)
    if n == 0 or n % widened:
        raise ValueError(
            f"{name} has {n} slots: transfers move whole pages of {widened} slots "
            "(page_size x dcp_size)"
        )
    # numpy, single-threaded: torch's intra-op thread pool costs milliseconds per small op
    # on a many-core host shared by several ranks, and this runs on every transfer's issue path
    slots = indices.numpy()
    starts = slots[::widened]
    steps = slots[1:] - slots[:-1]
    steps[widened - 1 :: widened] = 1  # a page may start anywhere after the previous one
    if (starts % widened).any() or (steps != 1).any():
        raise ValueError(
            f"{name} is not page-aligned: every {widened} consecutive slots must "
            f"be one whole page (start at a multiple of {widened}, then +1 each)"
        )
    if starts.min() < 0 or starts.max() + widened > num_slots:  # whole pages: starts suffice
        raise ValueError(f"{name} has slots outside 0..{num_slots - 1}")
    pages = starts // widened
    ordered = np.sort(pages)
    if (ordered[1:] == ordered[:-1]).any():
        raise ValueError(f"{name} names a page twice: each page moves once per transfer")
    return torch.from_numpy(pages)


def _load_steps(plan: TransferPlan, staging_bytes: int) -> tuple[Step, ...]:
    """Per model layer, each of its units; exchanged units in staging-sized page slices."""
    n = plan.num_pages
    slices: dict[int, list[tuple[Unit, int, int]]] = {}
    for u in plan.units:
        per = max(1, staging_bytes // u.page_bytes) if plan.exchanged(u) else n
        slices.setdefault(u.layer, []).extend((u, f, min(per, n - f)) for f in range(0, n, per))
    steps: list[Step] = []
    for layer in sorted(slices):
        last = len(slices[layer]) - 1
        steps += [Step(u, f, c, i == last) for i, (u, f, c) in enumerate(slices[layer])]
    return tuple(steps)
