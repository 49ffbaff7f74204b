"""SGLang's host KV pool seen as this project's page objects: the model geometry its buffer
holds, and each page's units as views of the pool's own memory (nothing copied).

A page's object holds its units in order, each unit one layer's `page_size` rows: MLA's
layers, or MHA's K layers then V layers (SGLang keeps K and V apart, `kv_buffer[0]` and
`kv_buffer[1]`). Where a unit's page is contiguous in the pool (`layer_first`,
`page_first_direct`) the store reads into it and writes from it directly. `page_first`
keeps a page token-major (each token's rows of every layer together), so one unit's page is
`page_size` rows strided by all the layers' bytes: it moves through a staging buffer laid
out as the object, one torch copy per page (see `HostPages.direct`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pipeline.core.model import KvDtype, ModelGeometry, ModelKind

LAYOUTS = ("layer_first", "page_first", "page_first_direct")
"""SGLang's host layouts whose pages this adapter moves (page_head, page_unified and
page_first_kv_split are other layouts of other pools: refused at registration)."""
KV_DTYPES = {
    torch.bfloat16: KvDtype.bf16,
    torch.float16: KvDtype.fp16,
    torch.float8_e4m3fn: KvDtype.fp8,
    torch.float8_e5m2: KvDtype.fp8,
    torch.uint8: KvDtype.fp8,
}
"""The KV dtypes SGLang's pools keep that this project's format names (fp8 as uint8 bytes;
the torch dtype also goes into the model's name, so e4m3 and e5m2 never share objects)."""
POOLS = {"MLATokenToKVPoolHost": True, "MHATokenToKVPoolHost": False}
"""SGLang's host pools whose `kv_buffer` holds all of a page's KV, by class name (exactly:
a subclass such as the MXFP8 pool keeps scales in other buffers), and whether it is MLA."""


@dataclass(frozen=True)
class Unit:
    """Where one unit's page lies in the pool's bytes: page p at `first + p * stride`."""

    first: int
    stride: int
    nbytes: int


class HostPages:
    """One SGLang host pool (`MLATokenToKVPoolHost` or `MHATokenToKVPoolHost`, or a pool of
    their buffer shapes) as pages of units, each a view of the pool."""

    def __init__(self, pool: Any, *, name: str) -> None:
        kind = type(pool).__name__
        if kind not in POOLS:
            raise NotImplementedError(
                f"host pool {kind}: this backend moves the pages of {sorted(POOLS)} (a DSA "
                "indexer, Mamba, SWA or scale pool moves through SGLang's v2 calls: not served)"
            )
        layout, buffer, mla = pool.layout, pool.kv_buffer, POOLS[kind]
        if layout not in LAYOUTS:
            raise NotImplementedError(
                f"host layout {layout!r}: this backend moves {', '.join(LAYOUTS)} pages "
                "(start SGLang with --hicache-mem-layout set to one of them)"
            )
        if buffer is None or buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise NotImplementedError(
                "the host pool has no contiguous CPU kv_buffer (an allocator-only or a "
                "split pool): nothing to move"
            )
        self.layout, self.buffer, self.mla = layout, buffer, mla
        self.page_size = int(pool.page_size)
        self.num_pages = int(pool.size) // self.page_size
        units = self.page(0)
        self.units_per_page = len(units)
        row_bytes = units[0][0].nbytes
        self.model = geometry(name, buffer.dtype, mla, len(units), row_bytes, self.page_size)
        self.memory = buffer.view(-1).view(torch.uint8).numpy().data.cast("B")
        """The whole pool as bytes: what a store may register, and what unit views slice."""
        base = buffer.data_ptr()
        later = self.page(1) if self.num_pages > 1 else units
        self.units = [
            Unit(u.data_ptr() - base, v.data_ptr() - u.data_ptr(), u[0].nbytes * self.page_size)
            for u, v in zip(units, later, strict=True)
        ]
        self.direct = all(u.is_contiguous() for u in units)
        """Every unit's page is one run of bytes in the pool: reads land in it and writes
        leave from it. False for page_first, where a unit's page is `page_size` rows one
        token's rows of every layer apart: a read would scatter into (and a write gather
        from) `page_size` x units buffers of one row each (thousands of iovecs a page, more
        than one preadv takes, and Mooncake registers regions, not rows), so the page moves
        through a staging buffer instead: one extra copy of the page's bytes, in torch
        (outside Python's lock), per read or write."""

    def page(self, page: int) -> list[torch.Tensor]:
        """Page `page`'s units in object order, each [page_size, ...] a view of the pool."""
        first, size, buf = page * self.page_size, self.page_size, self.buffer
        if self.mla:  # layer_first [layers, tokens, 1, dim]; page_first [tokens, layers, 1,
            # dim]; page_first_direct [pages, layers, page_size, 1, dim]
            if self.layout == "layer_first":
                return list(buf[:, first : first + size].unbind(0))
            if self.layout == "page_first":
                return list(buf[first : first + size].unbind(1))
            return list(buf[page].unbind(0))
        # MHA: [2, layers, tokens, heads, dim], [2, tokens, layers, heads, dim] and
        # [2, pages, layers, page_size, heads, dim]: K's layers, then V's
        if self.layout == "layer_first":
            halves = buf[:, :, first : first + size]
        elif self.layout == "page_first":
            halves = buf[:, first : first + size].transpose(1, 2)
        else:
            halves = buf[:, page]
        return [unit for half in halves.unbind(0) for unit in half.unbind(0)]

    def stacked(self, page: int) -> torch.Tensor:
        """Page `page`'s units stacked in object order ([units, page_size, ...] for MLA,
        [2, layers, page_size, ...] for MHA): one strided view of the pool, for the one copy
        a staged page takes."""
        first, size, buf = page * self.page_size, self.page_size, self.buffer
        assert self.layout == "page_first", "direct layouts move their pages in place"
        if self.mla:
            return buf[first : first + size].transpose(0, 1)
        return buf[:, first : first + size].transpose(1, 2)

    def unit_views(self) -> dict[int, torch.Tensor]:
        """Each unit's pages as one view of the pool, [pages, page_size, row elements], by
        unit ordinal: where a batch of pages reads and writes (`pipeline.engine.l3.pages.
        Placement`: one run of bytes a page, or page_first's rows a token apart)."""
        found = {}
        for i, (unit, view) in enumerate(zip(self.units, self.page(0), strict=True)):
            rows = view.flatten(1)
            assert rows.data_ptr() == view.data_ptr(), "a unit's rows are a view of the pool"
            step = unit.stride // self.buffer.element_size()
            shape, strides = (self.num_pages, *rows.shape), (step, *rows.stride())
            found[i] = self.buffer.as_strided(shape, strides, rows.storage_offset())
        return found

    def views(self, page: int) -> list[memoryview]:
        """Page `page`'s units as bytes of the pool (direct layouts only)."""
        at = [u.first + page * u.stride for u in self.units]
        return [self.memory[a : a + u.nbytes] for a, u in zip(at, self.units, strict=True)]


def geometry(
    name: str, dtype: torch.dtype, mla: bool, units: int, row_bytes: int, page_size: int
) -> ModelGeometry:
    """The model geometry a page object of these units is keyed under (its namespace)."""
    if dtype not in KV_DTYPES:
        raise NotImplementedError(
            f"KV dtype {dtype}: this project's objects hold {sorted(d.value for d in KvDtype)}"
        )
    kv_dtype = KV_DTYPES[dtype]
    if dtype not in (torch.bfloat16, torch.float16, torch.uint8):
        name = f"{name}-{str(dtype).removeprefix('torch.')}"
    return ModelGeometry(
        name=name,
        kind=ModelKind.mla if mla else ModelKind.mha,
        num_layers=units,
        kv_row_bytes=row_bytes,
        kv_dtype=kv_dtype,
        page_size=page_size,
    )
