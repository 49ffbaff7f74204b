"""The hand-written peer of `bench`: the same copies and broadcasts as a strategy, in a plain
loop over plain tensors (its own host buffer in the case's layout, the engine's device pool).

The yardstick, not the product path: no stages, plan or trace, and its own calls (the engine
batches layers where it can). Contiguous pages are one DMA per layer (`cudaMemcpy2DAsync`
where the layout spaces a layer's pages apart), broadcast straight
into the device slots; fragmented pages use the same UVA gather/scatter kernels as the `kernel`
io backend, with a staging buffer for broadcasts. On cuda copies run on one stream and
broadcasts on another, each broadcast behind its layer's copy.
"""

from __future__ import annotations

import contextlib

import torch

from pipeline.engine.cuda.memcpy import pages_view
from pipeline.engine.engine import Engine
from pipeline.engine.transfer.pools import HostPool, uva_alias


class Reference:
    """One rank's hand-written backup and load-back for an engine's strategy and device pool."""

    def __init__(
        self,
        engine: Engine,
        host: HostPool,
        host_pages: list[int],
        source_pages: list[int],
        target_pages: list[int],
        contiguous: bool,
    ) -> None:
        self.engine = engine
        self.host = host
        self.contiguous = contiguous
        self.pages = {"host": host_pages, "source": source_pages, "target": target_pages}
        self.num_pages = len(host_pages)
        self.cuda = engine.runtime.device.type == "cuda"
        if self.cuda and not contiguous:  # kernels reach the host through its UVA alias
            device = engine.runtime.device
            host = host.alias([uva_alias(b, device) for b in host.storage])
        self.host_views = host.views

    def _index(self, side: str) -> torch.Tensor:
        return torch.tensor(self.pages[side], device=self.engine.runtime.device)

    def _host(self, ordinal: int) -> torch.Tensor:
        return self.host_views[ordinal]

    def _dma(self, dst: torch.Tensor, dst_side: str, src: torch.Tensor, src_side: str) -> None:
        """All pages of one layer, consecutive on both sides: one copy call."""
        first = self.pages[dst_side][0], self.pages[src_side][0]
        copy = self.engine.runtime.copy_pages
        copy(pages_view(dst), first[0], pages_view(src), first[1], self.num_pages)

    def _block(self, t: torch.Tensor, side: str) -> torch.Tensor:
        first = self.pages[side][0]
        return t[first : first + self.num_pages]

    def backup(self, streams: tuple[torch.cuda.Stream, ...] | None) -> None:
        engine, rank = self.engine, self.engine.runtime.rank
        source = self._index("source")
        _fork(streams)
        with _on(streams[0] if streams else None):
            for unit in engine.owners.owned(rank, engine.model.units):
                dev, host = engine.device_pool.layer(unit), self._host(unit.ordinal)
                if self.contiguous:
                    self._dma(host, "host", dev, "source")
                else:
                    host.index_copy_(0, self._index("host"), dev.index_select(0, source))
        _join(streams)

    def load(self, staging: torch.Tensor, streams: tuple[torch.cuda.Stream, ...] | None) -> None:
        engine, rt = self.engine, self.engine.runtime
        owners, n = engine.owners, self.num_pages
        target, host_index = self._index("target"), self._index("host")
        copied = {}
        _fork(streams)
        with _on(streams[0] if streams else None):
            for unit in engine.model.units:
                if owners.copies(unit.ordinal, rt.rank):
                    dev, host = engine.device_pool.layer(unit), self._host(unit.ordinal)
                    if self.contiguous:
                        self._dma(dev, "target", host, "host")
                    else:
                        dev.index_copy_(0, target, host.index_select(0, host_index))
                    if streams:
                        copied[unit.ordinal] = torch.cuda.current_stream().record_event()
        with _on(streams[1] if streams else None):
            for unit in engine.model.units:
                if not owners.exchanged(unit.ordinal):
                    continue
                if unit.ordinal in copied:
                    torch.cuda.current_stream().wait_event(copied[unit.ordinal])
                source, dev = owners.sources[unit.ordinal], engine.device_pool.layer(unit)
                assert source is not None, "an exchanged unit has its source"
                if self.contiguous:
                    rt.collectives.broadcast(self._block(dev, "target"), source)
                    continue
                per = staging.numel() // unit.page_bytes  # staging-sized slices of pages
                for first in range(0, n, per):
                    pages = target[first : first + per]
                    raw = staging[: len(pages) * unit.page_bytes]
                    view = raw.view(dev.dtype).view(len(pages), *dev.shape[1:])
                    if source == rt.rank:
                        torch.index_select(dev, 0, pages, out=view)
                    rt.collectives.broadcast(raw, source)
                    if source != rt.rank:
                        dev.index_copy_(0, pages, view)
        _join(streams)


def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
    """Issue a block on `stream` (inline on CPU)."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def _fork(streams: tuple[torch.cuda.Stream, ...] | None) -> None:
    """Every stream starts behind what the caller's stream has issued so far."""
    for stream in streams or ():
        stream.wait_stream(torch.cuda.current_stream())


def _join(streams: tuple[torch.cuda.Stream, ...] | None) -> None:
    """The caller's stream continues once every stream is done."""
    for stream in streams or ():
        torch.cuda.current_stream().wait_stream(stream)
