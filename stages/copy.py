"""copy: move a step's pages of its units between this rank's device and host pools.

One function per (direction, io backend). `direct` issues one DMA per run of pages consecutive
on both sides (strided where the host layout spaces a unit's pages apart). A backup's step
covers the units of a pool kind; where both pools keep them evenly spaced in one buffer, one
call per run covers them all: one strided DMA where each unit's run is one block on both sides
(layer_first), else one batch of DMAs (`pipeline.engine.cuda.memcpy_batch`). `kernel` issues one
`move_pages` per step (one launch on cuda that gathers and scatters, reaching pinned host
memory through its UVA alias; torch's index ops on CPU), reading or writing the host pages in
place where they are one run (and the device pages from the first where both sides are: one
strided torch copy on CPU, where the index ops over a token-major host run at half its
speed); where the pages are consecutive on both sides (outside CUDA graphs) and each a block
on the host, it makes the direct backend's DMAs instead. A chunked
backup's batch the plan marks `gathered` (direct copies to a page_first_direct host) first
gathers into a device batch buffer on the gather stream (`backup_batch`); a kernel moves a
chunk's pages of every stacked unit in one launch. Every call here is paid by the host on
every layer of every transfer, so the common cases make nothing per call but the call itself
(see BENCHMARKS.md, issue time).
"""

from __future__ import annotations

import functools

import torch

from pipeline.core.model import Unit
from pipeline.core.plan import Direction
from pipeline.core.steps import Step
from pipeline.core.topology import IoBackend
from pipeline.engine.cuda.memcpy import Pages, StackPages, pages_view
from pipeline.engine.cuda.page_kernel import MovePages, PageAt
from pipeline.engine.cuda.stacks import remembered
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Route, Transfer
from stages.copy_views import KernelViews, kernel_views, page_stacks, runs_are_blocks, stacks_of


class Copy:
    """Owners only: D2H for a backup, H2D for a load-back (see the module docstring)."""

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        plan = t.plan
        units = step.units
        if units[0].ordinal not in plan.spec.copied:
            return
        if step.gathered:
            backup_batch(t, step, stream)
            return
        # by identity: an enum's hash is a Python call, and this runs on every step
        load = plan.direction is Direction.load
        if len(units) > 1:  # found once per units tuple (the engine's steps share them)
            dma = plan.spec.io_backend is IoBackend.direct or (
                plan.consecutive and not plan.graphed
            )
            routes = t.res.copy_routes[dma]
            seen = routes.get(id(units))  # inline: `remembered` is a call, only on a miss
            if seen is not None and seen[0] is units:
                seen[1](t, step, load)
            else:
                remembered(routes, units, functools.partial(_route, t, dma=dma))(t, step, load)
        elif plan.spec.io_backend is IoBackend.direct or _one_dma(t, step):
            _unit_runs(t, step, load)  # inline: a load's every step is one unit
        else:
            _kernel(t, step, load, views=kernel_views(t, units))


def _route(t: Transfer, units: tuple[Unit, ...], *, dma: bool) -> Route:
    """How the engine copies a step of several `units` where the transfer allows DMAs
    (`dma`: the direct backend, or consecutive pages outside CUDA graphs) or not, kept in
    `Resources.copy_routes` by the identity of the tuple, which the engine's step layouts
    share across transfers and a chunked backup's steps share: one DMA per run of each unit,
    one call per run for all of them where the pools stack them, or their kernel calls (as
    `_one_dma`: DMAs only where a host page is one block)."""
    if not (dma and t.res.host_view.pages[units[0].ordinal].block):
        return functools.partial(_kernel, views=kernel_views(t, units))
    if (stacks := page_stacks(t, units)) is None:  # pools that do not stack them
        return _unit_runs
    host, device = stacks
    blocks = runs_are_blocks(t, units)
    return functools.partial(_stack_runs, host=host, device=device, blocks=blocks)


def _kernel(t: Transfer, step: Step, load: bool, *, views: list[KernelViews]) -> None:
    """One `move_pages` per set of views: a gather and a scatter by page id, in place where
    the host pages are one run (one torch kernel on CPU)."""
    host_ids, device_ids = t.step_ids(step)
    host_first, device_first = t.plan.host_first, t.plan.device_first
    host_at = host_ids if host_first is None else host_first + step.first
    device_at = device_ids if device_first is None else device_first + step.first
    move = t.res.move_pages
    for host, device, dim, units in views:
        if load:
            move(device, device_at, host, host_at, dim, step.count)
        else:
            move(host, host_at, device, device_at, dim, step.count)
        _traced(t, step.first, step.count, units, _page_bytes(step, units))


def _one_dma(t: Transfer, step: Step) -> bool:
    """Pages consecutive on both sides, each one block on the host, go to the copy engine as
    the direct backend's calls: no gather to do, and a DMA costs the host less to issue than
    a kernel (and the GPU no SMs). Not in a CUDA graph, which must not bake in page ids."""
    plan = t.plan
    if plan.graphed or not plan.consecutive:
        return False
    return t.res.host_view.pages[step.unit.ordinal].block


def _unit_runs(t: Transfer, step: Step, load: bool) -> None:
    """One DMA per run of each unit of the step (a load's step is one unit, as is a backup's
    where the pools do not stack its units), with nothing made per copy call, and the
    step's calls counted once where ops are not kept: the issue path's common case."""
    res = t.res
    copy, trace = res.copy_pages, res.trace
    hosts, devices = res.host_view.pages, res.device_pool.pages
    runs = t.plan.runs_in(step.first, step.count)
    for unit in step.units:
        host, device = hosts[unit.ordinal], devices[unit.ordinal]
        for first, host_page, device_page, count in runs:
            if load:
                copy(device, device_page, host, host_page, count)
            else:
                copy(host, host_page, device, device_page, count)
            if trace.keep_ops:
                where = {"host_page": host_page, "device_page": device_page}
                _traced(t, first, count, (unit,), unit.page_bytes, **where)
    if not trace.keep_ops:
        direction = "h2d" if load else "d2h"
        trace.count("copy", direction, step.nbytes, times=len(runs) * len(step.units))


def _stack_runs(
    t: Transfer, step: Step, load: bool, *, host: StackPages, device: StackPages, blocks: bool
) -> None:
    """One call per run for every unit of the step, made from integers, and counted once
    where ops are not kept: a strided DMA where each unit's run is one block on both sides
    (`blocks`), else a batch of DMAs (one per unit, or per page of a run shorter than that)."""
    res, units = t.res, len(step.units)
    copy, copy_stacks, trace = res.copy_pages, res.copy_stacks, res.trace
    runs = t.plan.runs_in(step.first, step.count)
    for first, host_page, device_page, count in runs:
        if not blocks:
            if load:
                copy_stacks(device, device_page, host, host_page, count)
            else:
                copy_stacks(host, host_page, device, device_page, count)
        elif load:
            copy(device.run(device_page, count), 0, host.run(host_page, count), 0, units)
        else:
            copy(host.run(host_page, count), 0, device.run(device_page, count), 0, units)
        if trace.keep_ops:
            where = {"host_page": host_page, "device_page": device_page}
            _traced(t, first, count, step.units, step.page_bytes, **where)
    if not trace.keep_ops:
        trace.count("copy", "h2d" if load else "d2h", step.nbytes, times=len(runs))


def backup_batch(t: Transfer, step: Step, stream: Stream) -> None:
    """A chunked backup batch to a page_first_direct host, through a batch buffer: gathered
    page-major [pages, units, ...] on the gather stream (one `move_pages`), then one DMA per
    run of host pages, as the host keeps a page's units together. What the batches share
    (views, page-wise views) is derived once per backup (`BatchRing`'s memos)."""
    ring, plan = t.batches, t.plan
    assert ring is not None, "the plan gathers stacked batches only"
    key = id(step.units)  # by identity, as the pools' stacked views: hashing units costs
    if key not in ring.stacked:
        ring.stacked[key] = _batch_views(t, step.units)
    host, device, host_pages = ring.stacked[key]
    first = plan.device_run(step)
    behind = t.device_ids is None and first is None  # the ids upload on `stream` next
    device_at = t.step_ids(step)[1] if first is None else first
    fill = functools.partial(_gather, t.res.move_pages, device, device_at, step.count)
    buffer, nbytes = ring.next_buffer, step.nbytes  # each read once: properties are calls
    shape = (step.count, host.shape[0], *host.shape[2:])
    batch = ring.next_batch(buffer, shape, device.dtype)
    batch = ring.gathered(fill, batch, stream, behind_stream=behind)
    trace = t.res.trace
    if trace.keep_ops:
        at = {"first": step.first, "pages": step.count, "buffer": buffer, "bytes": nbytes}
        trace.op("batch_gather", units=[u.ordinal for u in step.units], **at)
    else:
        trace.count("batch_gather", "", nbytes)
    _batch_dmas(t, step, batch, buffer, host_pages, nbytes)
    ring.moved_out(stream)


def _batch_dmas(
    t: Transfer, step: Step, batch: torch.Tensor, buffer: int, host_pages: Pages, nbytes: int
) -> None:
    """A batch [pages, units, ...] (in `buffer` of the ring, `nbytes` in all) to the host: one
    DMA per run of host pages."""
    ring, trace = t.batches, t.res.trace
    assert ring is not None, "the plan gathers stacked batches only"
    batch_key = (buffer, step.count)
    if batch_key not in ring.batch_pages:
        ring.batch_pages[batch_key] = pages_view(batch.flatten(1, 2))
    batch_pages = ring.batch_pages[batch_key]
    runs = t.plan.runs_in(step.first, step.count)
    for run in runs:
        t.res.copy_pages(host_pages, run.host_page, batch_pages, run.first - step.first, run.pages)
        if trace.keep_ops:
            where = {"host_page": run.host_page}
            _traced(t, run.first, run.pages, step.units, step.page_bytes, **where)
    if not trace.keep_ops:  # the batch's copy calls counted at once
        trace.count("copy", "d2h", nbytes, times=len(runs))


def _batch_views(t: Transfer, units: tuple[Unit, ...]) -> tuple[torch.Tensor, torch.Tensor, Pages]:
    """(host, device, the host's page-wise view) of a batch's stacked units, host and device
    [units, pages, ...]; the batch is page-major [pages, units, ...], as a page_first_direct
    host keeps a page, so it goes there in one DMA per run."""
    stacks = stacks_of(t, units)
    assert stacks is not None, "the plan gathers stacked batches only"
    host, device = stacks
    by_page = host.transpose(0, 1)
    assert by_page[0].is_contiguous(), "page_first_direct keeps a page's units together"
    return host, device, pages_view(by_page.flatten(1, 2))


def _gather(
    move: MovePages, device: torch.Tensor, device_at: PageAt, count: int, batch: torch.Tensor
) -> torch.Tensor:
    """Fill a page-major batch from the device's stacked units ([units, pages, ...])."""
    move(batch.transpose(0, 1), 0, device, device_at, 1, count)
    return batch


def _page_bytes(step: Step, units: tuple[Unit, ...]) -> int:
    """Bytes of a page of `units`: all of the step's (summed once), or one of them."""
    return step.page_bytes if units is step.units else units[0].page_bytes


def _traced(
    t: Transfer, first: int, count: int, units: tuple[Unit, ...], page_bytes: int, **where: int
) -> None:
    """Log a copy call of `count` pages of `units` (`page_bytes`: a page of all of them)."""
    direction = "d2h" if t.plan.direction is Direction.backup else "h2d"
    trace = t.res.trace
    if not trace.keep_ops:  # counts and bytes only: nothing else is made on the issue path
        trace.count("copy", direction, count * page_bytes)
        return
    ids = [u.ordinal for u in units]
    trace.op(
        "copy",
        direction=direction,
        **({"unit": ids[0]} if len(ids) == 1 else {"units": ids}),
        first=first,
        pages=count,
        bytes=count * page_bytes,
        **where,
    )
