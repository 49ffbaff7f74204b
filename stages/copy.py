"""copy: move a step's pages of its units between this rank's device and host pools."""

from __future__ import annotations

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
    units evenly spaced in one buffer (`stacked`), fewer calls cover them all: one kernel
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
