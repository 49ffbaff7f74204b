"""broadcast: send a step's pages from the unit's owner to the rest of its replica group."""

from __future__ import annotations

import torch

from pipeline.core.ownership import Role
from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


class Broadcast:
    """One primitive for both dedup strategies: the source rank is the unit's owner. It moves
    the step's pages straight between device slots where the plan lands them in place, else
    through staging. (Its order against the forward's collectives is the engine's: the forward
    gate, or forward-stream ordering.)"""

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        plan = t.plan
        role = plan.role(step.unit)
        if role is Role.none:
            return
        source = plan.source(step.unit)
        buffer, _ = t.exchange_buffer(step)
        t.res.collectives.broadcast(buffer.view(torch.uint8), source)
        t.res.trace.op(
            "broadcast",
            unit=step.unit.ordinal,
            first=step.first,
            pages=step.count,
            src=source,
            bytes=step.count * step.unit.page_bytes,
            sent=role is Role.send,
        )
