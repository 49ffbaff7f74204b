"""Which calls move a copy step: the stacked views of its units, one kernel call per set of
views, or one copy call per run for every stacked unit (see `stages.copy`)."""

from __future__ import annotations

import torch

from pipeline.core.model import Unit
from pipeline.engine.cuda.memcpy import StackPages
from pipeline.engine.transfer.state import Transfer


def stacks_of(t: Transfer, units: tuple[Unit, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(host, device) [units, pages, rows, words] views of several units, where both pools
    stack them (a single unit is copied through its own views)."""
    if len(units) < 2:
        return None
    host, device = t.res.host_view.stacked(units), t.res.device_pool.stacked(units)
    return None if host is None or device is None else (host, device)


KernelViews = tuple[torch.Tensor, torch.Tensor, int, tuple[Unit, ...]]
"""(host, device, page dimension, units) of one kernel call."""


def kernel_views(t: Transfer, units: tuple[Unit, ...]) -> list[KernelViews]:
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


def page_stacks(t: Transfer, units: tuple[Unit, ...]) -> tuple[StackPages, StackPages] | None:
    """(host, device) stacks of several units as copy calls take them, where both pools
    stack them: one call per run moves every unit (`stages.copy._stack_runs`)."""
    if len(units) < 2:
        return None
    host, device = t.res.host_view.stacked.pages(units), t.res.device_pool.stacked.pages(units)
    return None if host is None or device is None else (host, device)


def runs_are_blocks(t: Transfer, units: tuple[Unit, ...]) -> bool:
    """A unit's pages are contiguous on both sides (a layer-first host), so each unit's run
    is one block and one strided DMA moves the run of every stacked unit."""
    host = t.res.host_view.pages[units[0].ordinal]
    device = t.res.device_pool.pages[units[0].ordinal]
    return host.pitch == host.width and device.pitch == device.width
