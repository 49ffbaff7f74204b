"""record_event: mark a layer usable (last step of a layer) or the transfer done (finish)."""

from __future__ import annotations

from pipeline.context import Stream, TransferContext
from pipeline.plan import Step


class RecordEvent:
    """Record the layer's event after its last step; in a finish list, the transfer's ack."""

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        if step is None:
            stream.record(ctx.done)
        elif step.last_in_layer:
            stream.record(ctx.layer_events[step.unit.layer])
