"""copy: move a step's pages of one unit between this rank's device and host pools."""

from __future__ import annotations

from pipeline.context import Stream, TransferContext, step_pages
from pipeline.plan import Direction, Step
from pipeline.topology import IoBackend


class Copy:
    """Owners only: D2H for a backup, H2D for a load-back.

    io_backend direct issues one copy per run of consecutive pages (strided on the host side
    when other layers sit between its pages, as in page_first_direct);
    kernel issues one gather/scatter per step (`index_select`/`index_copy_`), which on cuda
    reads or writes pinned host memory through its UVA alias.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        assert step is not None, "copy is a per-step stage"
        plan, unit = ctx.plan, step.unit
        if not plan.copies(unit):
            return
        to_host = plan.direction is Direction.backup

        def traced(first: int, count: int, **where: int) -> None:
            direction = "d2h" if to_host else "h2d"
            ctx.trace.op(
                "copy",
                direction=direction,
                unit=unit.ordinal,
                first=first,
                pages=count,
                bytes=count * unit.page_bytes,
                **where,
            )

        if plan.io_backend is IoBackend.kernel:
            host_pages, device_pages = step_pages(ctx, step)
            host, device = ctx.host_view.words[unit.ordinal], ctx.device_pool.words[unit.ordinal]
            if to_host:
                host.index_copy_(0, host_pages, device.index_select(0, device_pages))
            else:
                device.index_copy_(0, device_pages, host.index_select(0, host_pages))
            traced(step.first, step.count)
            return
        device, host = ctx.device_pool.layer(unit), ctx.host_view.layer(unit)
        for run in plan.runs_in(step.first, step.count):
            if to_host:
                ctx.copy_pages(host, run.host_page, device, run.device_page, run.count)
            else:
                ctx.copy_pages(device, run.device_page, host, run.host_page, run.count)
            traced(run.first, run.count, host_page=run.host_page, device_page=run.device_page)
