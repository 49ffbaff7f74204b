"""scatter: peers copy the broadcast pages from staging into their own device slots."""

from __future__ import annotations

from pipeline.context import Stream, TransferContext, exchange_buffer, step_pages
from pipeline.plan import Step


class Scatter:
    """Every rank but the unit's owner: `index_copy_` staging into its own device pages
    (nothing to do when its pages of the step are consecutive: the broadcast landed there)."""

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        assert step is not None, "scatter is a per-step stage"
        plan = ctx.plan
        if not plan.exchanged(step.unit) or plan.source(step.unit) == plan.rank:
            return
        buffer, staged = exchange_buffer(ctx, step)
        if not staged:
            return
        _, device_pages = step_pages(ctx, step)
        ctx.device_pool.layer(step.unit).index_copy_(0, device_pages, buffer)
        ctx.trace.op(
            "scatter",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            bytes=step.count * step.unit.page_bytes,
        )
