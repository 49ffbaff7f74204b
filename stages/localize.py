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


def first_rows(indices: torch.Tensor, page_size: int, dcp_size: int, dcp_rank: int) -> torch.Tensor:
    """This DCP rank's first row of each widened page: `localize(...)[::page_size]`, computed
    on the page starts alone (a page_size x dcp_size-th of the slots)."""
    return indices[dcp_rank :: page_size * dcp_size] // dcp_size


class Localize:
    """Translate the plan's host and device slots into local page ids on the pool's device.

    Kernels index pages, so only each page's first row on this rank is needed: it is localized
    on the host, where the plan's slots are, and one small non-blocking copy (no device sync)
    moves both sides' ids, a page_size-th of the slots.
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        plan = ctx.plan

        firsts = torch.stack(
            [
                first_rows(indices, plan.page_size, plan.dcp_size, plan.dcp_rank)
                for indices in (plan.host_indices, plan.device_indices)
            ]
        )
        pages = firsts.to(ctx.device, non_blocking=True) // plan.page_size
        ctx.host_pages, ctx.device_pages = pages[0], pages[1]
