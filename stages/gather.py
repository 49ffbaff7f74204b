"""gather: the owner collects a unit's loaded pages into the staging buffer."""

from __future__ import annotations

import torch

from pipeline.context import Stream, TransferContext, exchange_buffer, step_pages
from pipeline.plan import Step


class Gather:
    """Owner of an exchanged unit: `index_select` its device pages into staging, in order.

    Device page ids may differ per rank; only their order (the transfer's page order) is shared.
    Nothing to do when the owner's pages of the step are consecutive: it broadcasts them in place.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        assert step is not None, "gather is a per-step stage"
        plan = ctx.plan
        if not plan.exchanged(step.unit) or plan.source(step.unit) != plan.rank:
            return
        buffer, staged = exchange_buffer(ctx, step)
        if not staged:
            return
        _, device_pages = step_pages(ctx, step)
        torch.index_select(ctx.device_pool.layer(step.unit), 0, device_pages, out=buffer)
        ctx.trace.op(
            "gather",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            bytes=step.count * step.unit.page_bytes,
        )
