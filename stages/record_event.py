"""record_event: mark a layer usable (after its last step) or the transfer done (finish)."""

from __future__ import annotations

from pipeline.core.steps import Step
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


class RecordEvent:
    """Per step: record the layer's event after its last step. Per transfer (a finish list):
    record the transfer's ack."""

    def on_step(self, t: Transfer, step: Step, stream: Stream) -> None:
        if step.last_in_layer:
            stream.record(t.layer_events[step.unit.layer])

    def on_transfer(self, t: Transfer, stream: Stream) -> None:
        stream.record(t.done)
