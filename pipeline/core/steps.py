"""Steps: the grain a per-step stage works on, laid out once per transfer shape.

A step is some units over a slice of the transfer's pages. Loads walk the model's layers in
order (a layer usable as soon as its last step is done); backups copy every owned unit, in
page batches when chunked. Steps depend only on the page count once a rank's facts are fixed,
so an engine lays them out once per (direction, page count).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from pipeline.core.model import Unit, by_pool_kind

E = TypeVar("E")


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
    page_bytes: int = field(init=False)
    """Bytes of one page of all the step's units (summed once: read on the issue path)."""
    layers: tuple[int, ...] = ()
    """The model layers the step belongs to, in order (default: its units'): one, or a load's
    group of layers, all usable after the group's `last_in_layer` step."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "page_bytes", sum(u.page_bytes for u in self.units))
        if not self.layers:
            object.__setattr__(self, "layers", tuple(sorted({u.layer for u in self.units})))

    @property
    def unit(self) -> Unit:
        """The step's first unit (its only one in a load)."""
        return self.units[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the step's pages of all its units."""
        return self.count * self.page_bytes


@dataclass(frozen=True)
class StepLayout:
    """The steps of one transfer shape, and the same steps grouped by model layer."""

    steps: tuple[Step, ...]
    by_layer: Mapping[int, tuple[Step, ...]]
    """Per layer, its steps (a group's steps under the group's last layer, none under the
    others: they complete together)."""
    layers: tuple[int, ...]
    """The model layers the steps cover, in step order."""

    @classmethod
    def of(cls, steps: tuple[Step, ...]) -> StepLayout:
        grouped: dict[int, list[Step]] = {}
        for step in steps:
            for layer in step.layers:
                grouped.setdefault(layer, [])
            grouped[step.layers[-1]].append(step)
        by_layer = MappingProxyType({k: tuple(v) for k, v in grouped.items()})
        return cls(steps, by_layer, tuple(by_layer))

    def layer_events(self, new_event: Callable[[], E]) -> dict[int, E]:
        """Per layer, the event its load records once it is usable: one per step that
        completes layers, shared by the layers of a group."""
        events: dict[int, E] = {}
        for step in self.steps:
            if step.last_in_layer:
                event = new_event()
                events.update(dict.fromkeys(step.layers, event))
        return events


def backup_steps(
    copied: tuple[Unit, ...],
    num_pages: int,
    *,
    chunk_pages: int,
    batch_bytes: int,
    buffer_bytes: int,
    one_call_batches: bool,
) -> tuple[Step, ...]:
    """Every copied unit over every page, one step per pool kind per batch of pages (split
    where a step would move more than `batch_bytes`): one step covers many units, so a copy
    call or kernel can move them all (a backup has no layer to make usable early). With
    `chunk_pages` > 0 the batches are that many pages, else one batch of every page. A batch
    step of several units that fits `buffer_bytes` is gathered into a batch buffer first,
    where the host takes a batch in one call (`one_call_batches`)."""
    steps = []
    chunk_pages = chunk_pages if chunk_pages > 0 else num_pages
    kinds = by_pool_kind(copied)
    # one tuple per batch of units, shared by the chunks' steps: the issue path memoizes
    # views of a step's units by the tuple's identity
    batches: dict[tuple[int, int, int], tuple[Unit, ...]] = {}
    for first in range(0, num_pages, chunk_pages):
        count = min(chunk_pages, num_pages - first)
        for k, units in enumerate(kinds):
            per = max(1, batch_bytes // (count * units[0].page_bytes))
            for i in range(0, len(units), per):
                batch = batches.setdefault((k, i, per), units[i : i + per])
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
    group_bytes: int = 0,
    breaks: frozenset[int] = frozenset(),
) -> tuple[Step, ...]:
    """Per model layer, each of its units; exchanged units in staging-sized page slices.
    Consecutive layers none of whose units is exchanged go together, one step per pool kind,
    until a group moves at least `group_bytes` (0: every layer on its own) or the next layer
    is one of `breaks` (a streamed load's groups of reads: no step waits for two)."""
    n = num_pages
    by_layer: dict[int, list[Unit]] = {}
    for u in units:
        by_layer.setdefault(u.layer, []).append(u)
    steps: list[Step] = []
    group: list[Unit] = []
    grouped = 0  # bytes the group moves
    for layer in sorted(by_layer):
        layer_units = by_layer[layer]
        exchanges = any(exchanged(u) for u in layer_units)
        if exchanges or layer in breaks:
            steps += _group_steps(group, n)
            group, grouped = [], 0
        if exchanges:
            slices = []
            for u in layer_units:
                per = max(1, staging_bytes // u.page_bytes) if exchanged(u) else n
                slices += [(u, f, min(per, n - f)) for f in range(0, n, per)]
            last = len(slices) - 1
            steps += [Step((u,), f, c, i == last) for i, (u, f, c) in enumerate(slices)]
            continue
        group += layer_units
        grouped += n * sum(u.page_bytes for u in layer_units)
        if grouped >= group_bytes:
            steps += _group_steps(group, n)
            group, grouped = [], 0
    return tuple(steps + _group_steps(group, n))


def _group_steps(group: list[Unit], num_pages: int) -> list[Step]:
    """One step per pool kind of a group of layers' units; the last completes the group."""
    kinds, layers = by_pool_kind(tuple(group)), tuple(sorted({u.layer for u in group}))
    return [
        Step(units, 0, num_pages, i == len(kinds) - 1, layers=layers)
        for i, units in enumerate(kinds)
    ]
