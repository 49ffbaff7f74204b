"""verify: every N loads, check that all ranks of the replica group loaded the same pages."""

from __future__ import annotations

import torch
import torch.distributed as dist

from pipeline.context import Stream, TransferContext, page_ids
from pipeline.plan import Step


def page_digests(pages: torch.Tensor) -> torch.Tensor:
    """Per page: a position-weighted sum of its bytes (int64), sensitive to any changed byte."""
    data = pages.reshape(len(pages), -1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(1, data.shape[1] + 1, dtype=torch.int64, device=data.device)
    return (data * weights).sum(dim=1)


class Verify:
    """All-gather per-page digests of the loaded pages; a mismatch raises with layer and page.

    A debug check: reading the result back costs a device->host sync, so it runs only on the
    loads the engine marks (`ctx.verify`: every `strategy.verify_every`-th load).
    """

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None:
        group = ctx.plan.owners.group
        if not ctx.verify or len(group) == 1:
            return
        _, device_pages = page_ids(ctx)
        units = ctx.plan.units
        mine = torch.stack(
            [page_digests(ctx.device_pool.layer(u).index_select(0, device_pages)) for u in units]
        )
        everyone = [torch.empty_like(mine) for _ in group]
        dist.all_gather(everyone, mine, group=ctx.group)
        ctx.trace.op("verify", bytes=mine.nbytes * len(group))
        reference = everyone[0].cpu()
        for rank, theirs in zip(group, everyone, strict=True):
            diff = (theirs.cpu() != reference).nonzero()
            if len(diff):
                u, page = (int(x) for x in diff[0])
                unit = units[u]
                raise RuntimeError(
                    f"verify: rank {rank} loaded different bytes than rank {group[0]} at "
                    f"{unit.pool} layer {unit.layer}, transfer page {page} (host page "
                    f"{int(ctx.plan.host_pages[page])}); {len(diff)} pages differ"
                )
