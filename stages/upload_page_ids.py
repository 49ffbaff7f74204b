"""upload_page_ids: put the transfer's page ids on the pool's device before the first kernel."""

from __future__ import annotations

from pipeline.core.topology import IoBackend
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


class UploadPageIds:
    """One non-blocking copy of both sides' page ids onto the device, on the transfer stream,
    into a buffer the engine lends (`pipeline.engine.cuda.page_ids`: none is allocated per
    transfer).

    The plan already localized them (with DCP, logical page p is local page p on every rank:
    `pipeline.core.slots`), so there is no op over the slots and no device sync. Kernel
    copies index pages by these ids; direct copies take page numbers from the plan's runs and
    need the ids only for a staged exchange or a verify, which move them on first use
    (`Transfer.page_ids`), so a direct transfer of consecutive pages never waits for them.
    Nor does a kernel transfer of consecutive pages: it goes as the direct backend's copy
    calls (`stages.copy`), which take no ids; nor a graphed one, whose replay copies its ids
    into the graph's own buffer (`pipeline.engine.transfer.graphs`).
    """

    def on_transfer(self, t: Transfer, stream: Stream) -> None:
        plan = t.plan
        if plan.spec.io_backend is IoBackend.kernel and not (plan.graphed or plan.consecutive):
            t.page_ids()
