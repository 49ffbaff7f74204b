"""Which calls move a copy step: the stacked views of its units, one kernel call per set of
views, one DMA per run (see `stages.copy`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch

from pipeline.engine.memcpy import Pages, StackPages
from pipeline.engine.transfer import Transfer
from pipeline.spec.model import Unit
from pipeline.spec.steps import Step


def stacks_of(t: Transfer, units: tuple[Unit, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(host, device) [units, pages, rows, words] views of several units, where both pools
    stack them (a single unit is copied through its own views)."""
    if len(units) < 2:
        return None
    host, device = t.res.host_view.stacked(units), t.res.device_pool.stacked(units)
    return None if host is None or device is None else (host, device)


def kernel_views(
    t: Transfer, units: tuple[Unit, ...]
) -> list[tuple[torch.Tensor, torch.Tensor, int, tuple[Unit, ...]]]:
    """(host, device, page dimension, units) per kernel call: the stacked units in one call,
    else one call per unit."""
    if len(units) == 1:
        ordinal = units[0].ordinal
        return [(t.res.host_view.words[ordinal], t.res.device_pool.words[ordinal], 0, units)]
    stacks = stacks_of(t, units)
    if stacks is not None:
        return [(*stacks, 1, units)]
    host, device = t.res.host_view.words, t.res.device_pool.words
    return [(host[u.ordinal], device[u.ordinal], 0, (u,)) for u in units]


class Dma(NamedTuple):
    """One DMA call (`blocks` pages from `host_at` / `device_at` of two page-wise views) and
    what it moves (transfer pages from `first`, of `units`)."""

    host: Pages
    host_at: int
    device: Pages
    device_at: int
    blocks: int
    first: int
    pages: int
    units: tuple[Unit, ...]
    where: dict[str, int]
    """The run's first host and device page, for the trace."""


def dmas(t: Transfer, step: Step) -> Iterator[Dma]:
    """Per run of pages of a step whose runs are not blocks on both sides (`block_stacks`
    takes those): where the pools stack the units, the fewer of one DMA per unit and one per
    page (that page of every unit as one strided copy, made from integers: `StackPages`)."""
    units = step.units
    res = t.res
    host_stack, device_stack = (
        res.host_view.stacked.pages(units),
        res.device_pool.stacked.pages(units),
    )
    stacked = len(units) > 1 and host_stack is not None and device_stack is not None
    host, device = res.host_view.pages, res.device_pool.pages
    for run in t.plan.runs_in(step.first, step.count):
        if stacked and run.pages < len(units):
            assert host_stack is not None and device_stack is not None
            for k in range(run.pages):  # page k of every unit in one call
                hp, dp = run.host_page + k, run.device_page + k
                at = {"host_page": hp, "device_page": dp}
                pages = (host_stack.page(hp), 0, device_stack.page(dp), 0, len(units))
                yield Dma(*pages, run.first + k, 1, units, at)
            continue
        at = {"host_page": run.host_page, "device_page": run.device_page}
        for u in units:
            pages = (host[u.ordinal], run.host_page, device[u.ordinal], run.device_page, run.pages)
            yield Dma(*pages, run.first, run.pages, (u,), at)


def block_stacks(t: Transfer, units: tuple[Unit, ...]) -> tuple[StackPages, StackPages] | None:
    """(host, device) stacks of several units whose runs are each one block on both sides
    (a layer-first host): one strided DMA per run moves every unit (`_stack_runs`)."""
    if len(units) < 2 or not _runs_are_blocks(t, units):
        return None
    host, device = t.res.host_view.stacked.pages(units), t.res.device_pool.stacked.pages(units)
    return None if host is None or device is None else (host, device)


def unit_by_unit(t: Transfer, step: Step) -> bool:
    """Where `dmas` would make one DMA per unit and run (the pools do not stack the units, or
    every run is longer than the units): then `_unit_runs`' loop, which makes nothing per
    call but the call. Asked only of steps `block_stacks` does not take."""
    if stacks_of(t, step.units) is None:
        return True
    return all(run.pages > len(step.units) for run in t.plan.runs_in(step.first, step.count))


def _runs_are_blocks(t: Transfer, units: tuple[Unit, ...]) -> bool:
    """A unit's pages are contiguous on both sides (a layer-first host), so each unit's run
    is one block and one strided DMA moves the run of every stacked unit."""
    host = t.res.host_view.pages[units[0].ordinal]
    device = t.res.device_pool.pages[units[0].ordinal]
    return host.pitch == host.width and device.pitch == device.width
