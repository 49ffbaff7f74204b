"""broadcast: send the staged pages from the unit's owner to the rest of its replica group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipeline.context import Stream, TransferContext, exchange_buffer
from pipeline.plan import Step


class Broadcast:
    """One primitive for both dedup strategies: the source rank is the unit's owner. It moves
    the step's pages straight between device slots where they are consecutive, else staging.

    Runs on the dedicated transfer group. It refuses to run for a transfer that did not enter
    through an ordered entry point: an unordered broadcast can interleave with the forward's
    collectives in a different order on different ranks and deadlock.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        assert step is not None, "broadcast is a per-step stage"
        plan = ctx.plan
        if not plan.exchanged(step.unit):
            return
        if not ctx.ordered:
            raise RuntimeError(
                "a sharded load must enter through Engine.load (forward gate or forward-stream "
                "ordering); this one bypassed it and its broadcasts could deadlock"
            )
        nbytes = step.count * step.unit.page_bytes
        source = plan.source(step.unit)
        buffer, _ = exchange_buffer(ctx, step)
        dist.broadcast(buffer.view(torch.uint8), src=source, group=ctx.group)
        ctx.trace.op(
            "broadcast",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            src=source,
            bytes=nbytes,
            sent=source == plan.rank,
        )
