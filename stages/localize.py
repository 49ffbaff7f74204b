"""localize: logical (DCP-widened) slots -> this rank's page ids, once per transfer."""

from __future__ import annotations

import torch

from pipeline.context import Stream, TransferContext, page_ids
from pipeline.plan import Step
from pipeline.topology import IoBackend


def localize(indices: torch.Tensor, page_size: int, dcp_size: int, dcp_rank: int) -> torch.Tensor:
    """Local rows of this DCP rank: logical slot s lives on rank s % dcp at row s // dcp.

    A strided view (`indices[rank::dcp] // dcp`), never a boolean mask: a mask's nonzero would
    make the device wait for the host. Identity at dcp 1.
    """
    if not 0 <= dcp_rank < dcp_size:
        raise ValueError(f"dcp_rank={dcp_rank} is outside 0..{dcp_size - 1}")
    widened = page_size * dcp_size
    if len(indices) % widened:
        raise ValueError(
            f"{len(indices)} slots are not whole widened pages of {widened} (page_size "
            f"{page_size} x dcp_size {dcp_size})"
        )
    return indices[dcp_rank::dcp_size] // dcp_size


class Localize:
    """Put the transfer's page ids on the pool's device before the first kernel copy.

    The plan already localized them: widened page p is local page p on every DCP rank (its
    slots p x widened + r, r = rank + k x dcp_size, are local rows p x page_size + k: see
    `localize`), and kernels index whole pages. So this is one non-blocking copy of both
    sides' ids, on the transfer stream, with no op over the slots and no device sync. Direct
    copies take page numbers from the plan's runs: they need the ids only for a staged
    exchange or a verify, which move them on first use (`page_ids`), so a transfer of
    consecutive pages never waits for them.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        if ctx.plan.io_backend is IoBackend.kernel:
            page_ids(ctx)
