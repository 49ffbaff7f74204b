"""Device buffers a transfer's page ids go into, lent and reused rather than made per transfer.

A kernel transfer of scattered pages reads its page ids on the device. Allocating a tensor for
them on every transfer cost the issue path more than uploading them, once the host had run
anything else (docs/benchmarks/history/2026-12-02-to-04-sessions-12-23.md, session 22).
So an engine keeps a few buffers (each made on first use) and lends one per transfer. A
buffer is lent again only once its last transfer is done on the device: `done` recorded
and complete, the transfer not failed.
Every reader of the ids (the copy kernels, a batch's gather, an exchange, a verify) runs before
`done`, and a failed transfer's may still be running, so its buffer is not lent again. With
every buffer still in use a transfer gets none, and its caller allocates as before.
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch

from pipeline.engine.cuda.streams import Event

BUFFERS = 4
"""Buffers an engine lends: transfers in flight at once, before one allocates its own."""
VIEWS_KEPT = 64
"""Page counts a buffer keeps its views for before it starts over."""


class Holder(Protocol):
    """What a buffer waits on before it is lent again (a `Transfer`)."""

    @property
    def done(self) -> Event: ...

    @property
    def error(self) -> BaseException | None: ...


Rows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""([2, pages] int64, its host row, its device row): views of one buffer."""


class _Buffer:
    __slots__ = ("holder", "ids", "views")

    def __init__(self) -> None:
        self.ids: torch.Tensor | None = None
        self.holder: Holder | None = None
        self.views: dict[int, Rows] = {}

    def free(self) -> bool:
        holder = self.holder
        return holder is None or (holder.error is None and holder.done.settled())


class PageIdBuffers:
    """At most `BUFFERS` buffers of `most_pages` ids a side on `device` (see the module
    docstring). Thread-safe: on CPU a backup and a load plan on different worker threads."""

    def __init__(self, device: torch.device, most_pages: int) -> None:
        self.device = device
        self.most_pages = most_pages
        self._buffers = [_Buffer() for _ in range(BUFFERS)]
        self._lock = threading.Lock()

    def lend(self, holder: Holder, pages: int) -> Rows | None:
        """A free buffer's views of `pages` ids a side, now `holder`'s; None if all are in use
        (or `pages` is more than a buffer holds)."""
        if pages > self.most_pages:
            return None
        with self._lock:
            for buffer in self._buffers:
                if buffer.free():
                    buffer.holder = holder
                    return self._rows(buffer, pages)
        return None

    def _rows(self, buffer: _Buffer, pages: int) -> Rows:
        rows = buffer.views.get(pages)
        if rows is None:
            if buffer.ids is None:
                size = 2 * self.most_pages
                buffer.ids = torch.empty(size, dtype=torch.int64, device=self.device)
            if len(buffer.views) >= VIEWS_KEPT:
                buffer.views.clear()
            both = buffer.ids[: 2 * pages].view(2, pages)  # contiguous: one upload fills it
            rows = buffer.views[pages] = (both, both[0], both[1])
        return rows
