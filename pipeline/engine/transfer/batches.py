"""The two device buffers a chunked backup gathers its batches into, used in turn."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from pipeline.engine.cuda.memcpy import Pages
from pipeline.engine.cuda.streams import Event, Stream


class BatchRing:
    """One backup's walk over the engine's two batch buffers.

    The gather stream gathers batch k into buffer k % 2 while the transfer stream still moves
    batch k - 1 out of the other one; batch k + 2 reuses a buffer once batch k is on the host.
    """

    def __init__(self, buffers: torch.Tensor, gather: Stream) -> None:
        self.buffers = buffers
        self.gather = gather
        self.moved: list[Event] = []
        """Per batch, in order: its copy to the host is done."""
        self.stacked: dict[int, tuple[torch.Tensor, torch.Tensor, Pages]] = {}
        """By id of a step's units tuple (shared by the chunks' steps): the copy stage's
        (host, device, host page-wise) views of them, derived once per backup."""
        self.batch_pages: dict[tuple[int, int], Pages] = {}
        """By (buffer, pages): a batch's page-wise view, for its DMAs."""
        self._views: dict[tuple[int, tuple[int, ...], torch.dtype], torch.Tensor] = {}
        """By (buffer, shape, dtype): a batch's view of its buffer (`next_batch`)."""

    @property
    def next_buffer(self) -> int:
        """The buffer the next batch gathers into (0 or 1)."""
        return len(self.moved) % 2

    def next_batch(self, buffer: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The next batch's view of its buffer (`next_buffer`; made once per buffer and shape:
        the chunks of a backup share one)."""
        key = (buffer, shape, dtype)
        batch = self._views.get(key)
        if batch is None:
            nbytes = dtype.itemsize * math.prod(shape)
            batch = self.buffers[buffer, :nbytes].view(dtype).view(shape)
            self._views[key] = batch
        return batch

    def gathered(
        self,
        fill: Callable[[torch.Tensor], object],
        batch: torch.Tensor,
        stream: Stream,
        *,
        behind_stream: bool,
    ) -> torch.Tensor:
        """The next batch (`next_batch`): `fill(batch)` runs on the gather stream, and
        `stream` waits for it.

        The first batch, or one whose page ids `stream` is still uploading (`behind_stream`),
        starts behind everything issued on `stream` so far (the forward's writes, the ids)."""
        k = len(self.moved)
        if k == 0 or behind_stream:
            ready = stream.new_event()
            stream.record(ready)
            self.gather.wait_event(ready)
        if k >= 2:  # the buffer's previous batch is on the host
            self.gather.wait_event(self.moved[k - 2])
        done = self.gather.new_event()

        def gather_batch() -> None:
            fill(batch)
            self.gather.record(done)

        self.gather.submit(gather_batch)
        stream.wait_event(done)
        return batch

    def moved_out(self, stream: Stream) -> None:
        """The latest batch is on the host once `stream` reaches this point."""
        on_host = stream.new_event()
        stream.record(on_host)
        self.moved.append(on_host)
