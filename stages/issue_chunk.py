"""issue_chunk: split the all-layer backup batch into n-page batches, same copies in page order."""

from __future__ import annotations

from pipeline.context import Stream, TransferContext
from pipeline.plan import Step


class IssueChunk:
    """Batches of `chunk_pages` pages, each with every copied layer; 0 keeps one batch.

    Issued on one stream, so the copies of batch k run while batch k+1 is being issued. A
    batch's layers of one pool kind move together, at most `batch_bytes` per step (what one
    batch buffer, or a kernel call's temporary, holds: see `stages.copy`).
    """

    def __init__(self, *, chunk_pages: int = 0, batch_bytes: int) -> None:
        if chunk_pages < 0:
            raise ValueError(f"chunk_pages={chunk_pages} must be >= 0 (0 issues one batch)")
        self.chunk_pages = chunk_pages
        self.batch_bytes = batch_bytes

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        ctx.steps = ctx.plan.chunked(self.chunk_pages, self.batch_bytes)
