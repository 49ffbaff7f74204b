"""scatter: peers copy the broadcast pages from staging into their own device slots."""

from __future__ import annotations

from pipeline.core.ownership import Role
from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


class Scatter:
    """Every rank but the unit's owner: `index_copy_` staging into its own device pages
    (nothing to do where the plan lands the step in place: the broadcast wrote the slots)."""

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        plan = t.plan
        if plan.role(step.unit) is not Role.receive:
            return
        buffer, staged = t.exchange_buffer(step)
        if not staged:
            return
        _, device_ids = t.step_ids(step)
        t.res.device_pool.layer(step.unit).index_copy_(0, device_ids, buffer)
        t.res.trace.op(
            "scatter",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            bytes=step.count * step.unit.page_bytes,
        )
