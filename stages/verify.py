"""verify: after a marked load, check that all ranks of the replica group hold the same pages."""

from __future__ import annotations

import torch

from pipeline.engine.cuda.streams import Stream
from pipeline.engine.transfer.state import Transfer


def page_digests(pages: torch.Tensor) -> torch.Tensor:
    """Per page: a position-weighted sum of its bytes (int64), sensitive to any changed byte."""
    data = pages.reshape(len(pages), -1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(1, data.shape[1] + 1, dtype=torch.int64, device=data.device)
    return (data * weights).sum(dim=1)


class Verify:
    """All-gather per-page digests of the loaded pages; a mismatch raises with layer and page.

    A debug check: reading the result back costs a device->host sync, so it runs only on the
    loads the plan marks (`plan.verify`: every `strategy.verify_every`-th load).
    """

    def on_transfer(self, t: Transfer, stream: Stream) -> None:
        plan = t.plan
        group = plan.spec.owners.group
        if not plan.verify or len(group) == 1:
            return
        _, device_ids = t.page_ids()
        units, pool = plan.spec.units, t.res.device_pool
        mine = torch.stack([page_digests(pool.layer(u).index_select(0, device_ids)) for u in units])
        everyone = [torch.empty_like(mine) for _ in group]
        t.res.collectives.all_gather(everyone, mine)
        t.res.trace.op("verify", bytes=mine.nbytes * len(group))
        reference = everyone[0].cpu()
        for rank, theirs in zip(group, everyone, strict=True):
            diff = (theirs.cpu() != reference).nonzero()
            if len(diff):
                u, page = (int(x) for x in diff[0])
                unit = units[u]
                raise RuntimeError(
                    f"verify: rank {rank} loaded different bytes than rank {group[0]} at "
                    f"{unit.pool} layer {unit.layer}, transfer page {page} (host page "
                    f"{int(plan.host_pages[page])}); {len(diff)} pages differ"
                )
