"""Steps: the grain a per-step stage works on, laid out once per transfer shape.

A step is some units over a slice of the transfer's pages. Loads walk the model's layers in
order (a layer usable as soon as its last step is done); backups copy every owned unit, in
page batches when chunked. Steps depend only on the page count once a rank's facts are fixed,
so an engine lays them out once per (direction, page count).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.spec.model import Unit, by_pool_kind


@dataclass(frozen=True, slots=True)
class Step:
    """Units over a slice of the transfer's pages."""

    units: tuple[Unit, ...]
    """One unit; or in a chunked backup every unit of one pool kind this rank copies (up to
    the batch budget), whose pages of the slice move together."""
    first: int
    """Position of the first page of the slice in the transfer."""
    count: int
    last_in_layer: bool
    """The last step of its model layer: the layer is complete after it (load)."""
    gathered: bool = False
    """A chunked backup batch that first gathers into a device batch buffer (it covers several
    units, fits a buffer, and the host takes it in one call)."""

    @property
    def unit(self) -> Unit:
        """The step's first unit (its only one outside chunked backups)."""
        return self.units[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the step's pages of all its units."""
        return self.count * sum(u.page_bytes for u in self.units)


@dataclass(frozen=True)
class StepLayout:
    """The steps of one transfer shape, and the same steps grouped by model layer."""

    steps: tuple[Step, ...]
    by_layer: Mapping[int, tuple[Step, ...]]
    layers: tuple[int, ...]
    """The model layers the steps cover, in step order."""

    @classmethod
    def of(cls, steps: tuple[Step, ...]) -> StepLayout:
        grouped: dict[int, list[Step]] = {}
        for step in steps:
            grouped.setdefault(step.unit.layer, []).append(step)
        by_layer = MappingProxyType({k: tuple(v) for k, v in grouped.items()})
        return cls(steps, by_layer, tuple(by_layer))


def backup_steps(
    copied: tuple[Unit, ...],
    num_pages: int,
    *,
    chunk_pages: int,
    batch_bytes: int,
    buffer_bytes: int,
    one_call_batches: bool,
) -> tuple[Step, ...]:
    """Every copied unit over every page; with `chunk_pages` > 0 in batches of that many
    pages, one step per pool kind per batch (split where a step would move more than
    `batch_bytes`). A batch step of several units that fits `buffer_bytes` is gathered into
    a batch buffer first, where the host takes a batch in one call (`one_call_batches`)."""
    if chunk_pages <= 0:
        return tuple(Step((u,), 0, num_pages, True) for u in copied)
    steps = []
    for first in range(0, num_pages, chunk_pages):
        count = min(chunk_pages, num_pages - first)
        for units in by_pool_kind(copied):
            per = max(1, batch_bytes // (count * units[0].page_bytes))
            for i in range(0, len(units), per):
                batch = units[i : i + per]
                nbytes = count * sum(u.page_bytes for u in batch)
                gathered = one_call_batches and len(batch) > 1 and nbytes <= buffer_bytes
                steps.append(Step(batch, first, count, True, gathered))
    return tuple(steps)


def load_steps(
    units: tuple[Unit, ...],
    exchanged: Callable[[Unit], bool],
    num_pages: int,
    *,
    staging_bytes: int,
) -> tuple[Step, ...]:
    """Per model layer, each of its units; exchanged units in staging-sized page slices."""
    n = num_pages
    slices: dict[int, list[tuple[Unit, int, int]]] = {}
    for u in units:
        per = max(1, staging_bytes // u.page_bytes) if exchanged(u) else n
        slices.setdefault(u.layer, []).extend((u, f, min(per, n - f)) for f in range(0, n, per))
    steps: list[Step] = []
    for layer in sorted(slices):
        last = len(slices[layer]) - 1
        steps += [Step((u,), f, c, i == last) for i, (u, f, c) in enumerate(slices[layer])]
    return tuple(steps)
