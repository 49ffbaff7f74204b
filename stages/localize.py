"""localize: logical (DCP-widened) slots -> this rank's page ids, once per transfer."""

from __future__ import annotations

import torch

from pipeline.context import Stream, TransferContext
from pipeline.plan import Step


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
    """Move the plan's page ids to the pool's device, both sides in one non-blocking copy.

    The plan already localized them: widened page p is local page p on every DCP rank (its
    slots p x widened + r, r = rank + k x dcp_size, are local rows p x page_size + k: see
    `localize`), and kernels index whole pages. So no op runs over the slots here, and nothing
    makes the device wait for the host.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        plan = ctx.plan
        pages = torch.stack([plan.host_pages, plan.device_pages]).to(ctx.device, non_blocking=True)
        ctx.host_pages, ctx.device_pages = pages[0], pages[1]
