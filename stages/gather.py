"""gather: the owner collects a unit's loaded pages into the staging buffer."""

from __future__ import annotations

import torch

from pipeline.core.ownership import Role
from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


class Gather:
    """Owner of an exchanged unit: `index_select` its device pages into staging, in order.

    Device page ids may differ per rank; only their order (the transfer's page order) is shared.
    Nothing to do where the plan lands the step in place: it is broadcast from the slots.
    """

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        plan = t.plan
        if plan.role(step.unit) is not Role.send:
            return
        buffer, staged = t.exchange_buffer(step)
        if not staged:
            return
        _, device_ids = t.step_ids(step)
        torch.index_select(t.res.device_pool.layer(step.unit), 0, device_ids, out=buffer)
        t.res.trace.op(
            "gather",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            bytes=step.count * step.unit.page_bytes,
        )
