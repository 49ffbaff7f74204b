"""copy: move a step's pages of its units between this rank's device and host pools."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from pipeline.context import Stream, TransferContext, step_pages
from pipeline.plan import Direction, Step
from pipeline.topology import IoBackend, Unit


class Copy:
    """Owners only: D2H for a backup, H2D for a load-back.

    io_backend direct issues one copy per run of consecutive pages (strided on the host side
    when other layers sit between its pages, as in page_first_direct);
    kernel issues one gather/scatter per step (`index_select`/`index_copy_`), which on cuda
    reads or writes pinned host memory through its UVA alias.

    A chunked backup's step covers every unit of a pool kind. Where both pools hold those
    units evenly spaced in one buffer (`stacked`), fewer calls cover them all. Where a batch
    fits the engine's batch buffers (`batch_staging`) it is first gathered into one of them on
    the gather stream, while the transfer stream still moves the previous one to the host:
    then one scatter kernel, or one DMA per run of host pages where the host keeps a page's
    units together (page_first_direct), moves the batch (see `_gathered_batch`). Else one kernel
    over [units, pages], or per run of pages the fewer of one copy per unit and one per page
    (that page of every unit, as one strided copy). Else each unit is copied on its own.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        assert step is not None, "copy is a per-step stage"
        plan, units = ctx.plan, step.units
        if not plan.copies(step.unit):
            return
        to_host = plan.direction is Direction.backup
        host_words, device_words = ctx.host_view.words, ctx.device_pool.words
        stacks = _stacks(ctx, units)

        def traced(first: int, count: int, moved: tuple[Unit, ...], **where: int) -> None:
            ids = [u.ordinal for u in moved]
            ctx.trace.op(
                "copy",
                direction="d2h" if to_host else "h2d",
                **({"unit": ids[0]} if len(ids) == 1 else {"units": ids}),
                first=first,
                pages=count,
                bytes=count * sum(u.page_bytes for u in moved),
                **where,
            )

        def dma(h: torch.Tensor, host_page: int, d: torch.Tensor, device_page: int, n: int) -> None:
            if to_host:
                ctx.copy_pages(h, host_page, d, device_page, n)
            else:
                ctx.copy_pages(d, device_page, h, host_page, n)

        if to_host and stacks is not None and _gathered_batch(ctx, step, stacks, stream, traced):
            return
        if plan.io_backend is IoBackend.kernel:
            host_pages, device_pages = step_pages(ctx, step)
            if stacks is not None:
                calls = [(*stacks, 1, units)]
            else:
                calls = [(host_words[u.ordinal], device_words[u.ordinal], 0, (u,)) for u in units]
            for h, d, dim, moved in calls:
                if to_host:
                    h.index_copy_(dim, host_pages, d.index_select(dim, device_pages))
                else:
                    d.index_copy_(dim, device_pages, h.index_select(dim, host_pages))
                traced(step.first, step.count, moved)
            return
        for run in plan.runs_in(step.first, step.count):
            if stacks is not None and run.count < len(units):
                for k in range(run.count):  # page k of every unit in one call
                    hp, dp = run.host_page + k, run.device_page + k
                    dma(stacks[0][:, hp], 0, stacks[1][:, dp], 0, len(units))
                    traced(run.first + k, 1, units, host_page=hp, device_page=dp)
                continue
            at = {"host_page": run.host_page, "device_page": run.device_page}
            for u in units:
                h, d = host_words[u.ordinal], device_words[u.ordinal]
                dma(h, run.host_page, d, run.device_page, run.count)
                traced(run.first, run.count, (u,), **at)


def _stacks(
    ctx: TransferContext, units: tuple[Unit, ...]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(host, device) [units, pages, rows, words] views of a batch of units, where both pools
    stack them (a single unit is copied through its own views)."""
    if len(units) < 2:
        return None
    host, device = ctx.host_view.stacked(units), ctx.device_pool.stacked(units)
    return None if host is None or device is None else (host, device)


def _gathered_batch(
    ctx: TransferContext,
    step: Step,
    stacks: tuple[torch.Tensor, torch.Tensor],
    stream: Stream,
    traced: Callable[..., None],
) -> bool:
    """Move one batch of a chunked backup through a batch buffer; False where the plan says
    it does not go through one (`TransferPlan.gathers_batch`).

    The gather stream gathers batch k into buffer k % 2 while the transfer stream still moves
    batch k - 1 out of the other one; batch k + 2 reuses the buffer once batch k is on the
    host. The batch is laid out as the host takes it in one call: page-major [pages, units]
    for a DMA per run of host pages (page_first_direct keeps a page's units together), or
    unit-major [units, pages] for one scatter kernel.
    """
    buffers, plan = ctx.batch_staging, ctx.plan
    if buffers is None or not plan.gathers_batch(step, buffers.shape[1], ctx.host_pool.layout):
        return False
    host, device = stacks
    direct = plan.io_backend is IoBackend.direct
    if direct:  # page-major on both sides
        host, device = host.transpose(0, 1), device.transpose(0, 1)
        assert host[0].is_contiguous(), "page_first_direct keeps a page's units together"
    pages = 0 if direct else 1  # the page dimension of the views
    moved, gather = ctx.batches_moved, ctx.gather_stream
    k = len(moved)
    shape = list(host.shape)
    shape[pages] = step.count
    batch = buffers[k % 2, : step.nbytes].view(device.dtype).view(shape)
    first = plan.device_run(step) if direct else None
    uploading = ctx.device_pages is None and first is None
    fill: Callable[[], object]
    if first is not None:  # consecutive device pages: a strided copy, no ids needed
        fill = functools.partial(batch.copy_, device[first : first + step.count])
    else:
        host_pages, device_pages = step_pages(ctx, step)
        fill = functools.partial(torch.index_select, device, pages, device_pages, out=batch)
    if k == 0 or uploading:  # behind the transfer stream: forward writes, page ids
        ready = stream.new_event()
        stream.record(ready)
        gather.wait_event(ready)
    if k >= 2:  # the buffer's previous batch is on the host
        gather.wait_event(moved[k - 2])
    gathered = gather.new_event()

    def gather_batch() -> None:
        fill()
        gather.record(gathered)

    gather.submit(gather_batch)
    ctx.trace.op(
        "batch_gather",
        units=[u.ordinal for u in step.units],
        first=step.first,
        pages=step.count,
        bytes=step.nbytes,
        buffer=k % 2,
    )
    stream.wait_event(gathered)
    if direct:
        pages_of_host, pages_of_batch = host.flatten(1, 2), batch.flatten(1, 2)
        for run in plan.runs_in(step.first, step.count):
            at = run.first - step.first
            ctx.copy_pages(pages_of_host, run.host_page, pages_of_batch, at, run.count)
            traced(run.first, run.count, step.units, host_page=run.host_page)
    else:
        host.index_copy_(pages, host_pages, batch)
        traced(step.first, step.count, step.units)
    on_host = stream.new_event()
    stream.record(on_host)
    moved.append(on_host)
    return True
