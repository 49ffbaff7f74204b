"""Rotating write-backs: the owners of a page's other layers send them to the object's writer
(the replica group's first rank) over the L3 group, so every page is one object whoever wrote
it. These run on the write-back thread of every rank, in the same order; roles name TP
ranks, which are the L3 group's ranks."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.engine.l3.tier import L3Tier


def tell_missing(tier: L3Tier, missing: list[bool]) -> None:
    """The writer tells the senders which pages of the job it will write."""
    mask = torch.tensor(missing, dtype=torch.uint8)
    for sender in tier.roles.senders:
        tier.l3_group.send(mask, sender)


def hear_missing(tier: L3Tier, num_pages: int) -> list[bool]:
    mask = torch.empty(num_pages, dtype=torch.uint8)
    tier.l3_group.recv(mask, tier.roles.writer)
    return mask.bool().tolist()


def send_share(tier: L3Tier, host_pages: Sequence[int]) -> None:
    """Send the writer this rank's units of `host_pages`, page after page, each page's
    units in ordinal order."""
    owned = tier.roles.reads  # a rotating owner reads what it holds
    out = torch.empty((len(host_pages), sum(u.page_bytes for u in owned)), dtype=torch.uint8)
    for row, page in zip(out, host_pages, strict=True):
        first = 0
        for pooled, _ in tier.runs(owned, page, device=False):
            row[first : first + pooled.nbytes].view(pooled.dtype).view(pooled.shape).copy_(pooled)
            first += pooled.nbytes
    tier.l3_group.send(out, tier.roles.writer)
    tier.trace.op("l3_send", bytes=out.nbytes)


def receive_shares(tier: L3Tier, num_pages: int) -> list[dict[int, memoryview]]:
    """The senders' units of the next `num_pages` pages, by page and unit ordinal."""
    found: list[dict[int, memoryview]] = [{} for _ in range(num_pages)]
    for sender in tier.roles.senders:
        owned = tier.owners.owned(sender, tier.object.units)
        share = torch.empty((num_pages, sum(u.page_bytes for u in owned)), dtype=torch.uint8)
        tier.l3_group.recv(share, sender)
        for views, row in zip(found, share, strict=True):
            flat, first = memoryview(row.numpy()).cast("B"), 0
            for unit in owned:
                views[unit.ordinal] = flat[first : first + unit.page_bytes]
                first += unit.page_bytes
    return found
