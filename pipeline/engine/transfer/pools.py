"""Device and host pools and their layouts, pinned host memory and its UVA alias.

Every buffer is exposed page-wise as `layer(unit) -> Tensor[num_pages, rows_per_page, row_elems]`,
a view whatever the layout, so stages index pages and never branch on layout strings.
Constructors are pure; `allocate` classmethods create the tensors.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from types import MappingProxyType

import torch

from pipeline.core.model import KvDtype, ModelGeometry, Unit, by_pool_kind
from pipeline.core.topology import POOL_LAYOUTS, MemLayout
from pipeline.engine.cuda.memcpy import pages_view
from pipeline.engine.cuda.stacks import StackedViews

TORCH_DTYPES: Mapping[KvDtype, torch.dtype] = MappingProxyType(
    {
        KvDtype.bf16: torch.bfloat16,
        KvDtype.fp16: torch.float16,
        KvDtype.fp8: torch.uint8,
        KvDtype.fp4: torch.uint8,
    }
)


PIN_LIMIT_BYTES = 64 << 30
"""Largest buffer torch pins itself (its pinned allocator may round a size up to a power of
two): bigger pools are allocated pageable and registered with the driver whole."""


def as_words(t: torch.Tensor) -> torch.Tensor:
    """The same bytes viewed in the widest integer type that tiles every row: gather/scatter
    kernels then move 8-byte words instead of 1- or 2-byte elements (over PCIe for UVA)."""
    raw = t.view(torch.uint8)
    for dtype in (torch.int64, torch.int32, torch.int16):
        size = dtype.itemsize
        if all(s % size == 0 for s in (*raw.shape[-1:], *raw.stride()[:-1], raw.data_ptr())):
            return raw.view(dtype)
    return raw


def unit_dtype(model: ModelGeometry, unit: Unit) -> torch.dtype:
    """KV rows use the model's KV dtype; index-K rows are packed bytes."""
    return TORCH_DTYPES[model.kv_dtype] if unit.pool == "kv" else torch.uint8


def unit_shape(model: ModelGeometry, unit: Unit, num_pages: int) -> tuple[int, int, int]:
    itemsize = unit_dtype(model, unit).itemsize
    return (num_pages, unit.rows_per_page, unit.row_bytes // itemsize)


class DevicePool:
    """A view per unit, [num_pages, rows_per_page, row_elems], indexed by local page; the
    units of one pool kind ('kv', 'index') share one buffer [units, pages, rows, elems]."""

    def __init__(self, buffers: Mapping[int, torch.Tensor], num_pages: int) -> None:
        self.buffers = dict(buffers)
        self.num_pages = num_pages
        self.words = {o: as_words(b) for o, b in self.buffers.items()}
        """Per unit, the buffer as integer words (for gather/scatter kernels)."""
        self.pages = {o: pages_view(w) for o, w in self.words.items()}
        """Per unit, the words view as copy calls take it."""
        self.stacked = StackedViews(self.words)
        """Words of several units as one tensor, where they stack (see `stack_views`)."""

    @classmethod
    def allocate(cls, model: ModelGeometry, num_pages: int, device: torch.device) -> DevicePool:
        buffers = {}
        for units in by_pool_kind(model.units):
            shape = (len(units), *unit_shape(model, units[0], num_pages))
            buf = torch.empty(shape, dtype=unit_dtype(model, units[0]), device=device)
            buffers.update({u.ordinal: buf[i] for i, u in enumerate(units)})
        return cls(buffers, num_pages)

    @classmethod
    def adopt(
        cls,
        model: ModelGeometry,
        tensors: Mapping[tuple[str, int], torch.Tensor],
        device: torch.device,
    ) -> DevicePool:
        """A pool over the caller's own KV tensors, one per (pool kind, layer) of the model,
        each [pages, rows_per_page, row elements] of the unit's dtype on `device`; ValueError
        naming the first that is missing or does not fit."""
        units = {(u.pool, u.layer): u for u in model.units}
        if extra := sorted(set(tensors) - set(units)):
            raise ValueError(f"device_kv has tensors for units the model lacks: {extra[:4]}")
        pages = {t.shape[0] for t in tensors.values() if t.dim() == 3}
        num_pages = min(pages) if pages else 0
        for key, unit in units.items():
            t = tensors.get(key)
            want = (unit_shape(model, unit, num_pages), unit_dtype(model, unit), device)
            if t is None or (tuple(t.shape), t.dtype, t.device) != want or not t.is_contiguous():
                got = "missing" if t is None else f"{tuple(t.shape)} {t.dtype} on {t.device}"
                got += "" if t is None or t.is_contiguous() else f", not contiguous {t.stride()}"
                raise ValueError(
                    f"device_kv[{key!r}]: need a contiguous {want[0]} {want[1]} tensor on "
                    f"{device} (pages, rows per page, row elements); got {got}"
                )
        check_disjoint(tensors)
        return cls({u.ordinal: tensors[k] for k, u in units.items()}, num_pages)

    def layer(self, unit: Unit) -> torch.Tensor:
        return self.buffers[unit.ordinal]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


def check_disjoint(tensors: Mapping[tuple[str, int], torch.Tensor]) -> None:
    """ValueError naming both tensors where two share any byte (one layer's copies would
    write into another's)."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.nbytes, key) for key, t in tensors.items() if t.nbytes
    )
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise ValueError(
                f"device_kv[{first!r}] and device_kv[{second!r}] share memory: give each "
                "(pool kind, layer) a tensor of its own"
            )


class HostPool:
    """The units this rank owns, in one of three layouts; a view per unit, page-wise.

    layer_first       [unit, page, row-in-page, elems]  each layer contiguous
    page_first        [page, row-in-page, unit, elems]  token-major: a token's layers adjacent
    page_first_direct [page, unit, row-in-page, elems]  page-major: a page of a layer contiguous
    """

    def __init__(
        self,
        storage: list[torch.Tensor],
        num_pages: int,
        layout: MemLayout,
        owned: tuple[Unit, ...],
    ) -> None:
        self.storage = storage
        """One buffer per pool kind that has owned units ('kv' first, then 'index')."""
        self.num_pages = num_pages
        self.layout = layout
        self.owned = owned
        self.views: dict[int, torch.Tensor] = {}
        for buf, units in zip(storage, by_pool_kind(owned), strict=True):
            for i, u in enumerate(units):
                self.views[u.ordinal] = _unit_view(buf, layout, i)
        self.words = {o: as_words(v) for o, v in self.views.items()}
        """Per unit, the view as integer words (for gather/scatter kernels)."""
        self.pages = {o: pages_view(w) for o, w in self.words.items()}
        """Per unit, the words view as copy calls take it."""
        self.stacked = StackedViews(self.words)
        """Words of several units as one tensor, where they stack (see `stack_views`)."""

    def alias(self, storage: list[torch.Tensor]) -> HostPool:
        """The same pool over other tensors of the same shapes (e.g. its UVA alias on cuda)."""
        return HostPool(storage, self.num_pages, self.layout, self.owned)

    @classmethod
    def allocate(
        cls,
        model: ModelGeometry,
        owned: tuple[Unit, ...],
        num_pages: int,
        layout: MemLayout,
        pin_memory: bool,
        pin_limit_bytes: int = PIN_LIMIT_BYTES,
    ) -> HostPool:
        if layout not in POOL_LAYOUTS:
            raise ValueError(
                f"mem_layout={layout.value}: a job chooses it; a pool takes one of "
                f"{', '.join(m.value for m in POOL_LAYOUTS)}"
            )
        storage = []
        for units in by_pool_kind(owned):
            pages, rows, elems = unit_shape(model, units[0], num_pages)
            shape = {
                MemLayout.layer_first: (len(units), pages, rows, elems),
                MemLayout.page_first: (pages, rows, len(units), elems),
                MemLayout.page_first_direct: (pages, len(units), rows, elems),
            }[layout]
            dtype = unit_dtype(model, units[0])
            storage.append(host_buffer(shape, dtype, pin_memory, pin_limit_bytes))
        return cls(storage, num_pages, layout, owned)

    def layer(self, unit: Unit) -> torch.Tensor:
        if unit.ordinal not in self.views:
            raise ValueError(
                f"unit {unit.ordinal} ({unit.pool} layer {unit.layer}) is not "
                "held by this rank's host pool"
            )
        return self.views[unit.ordinal]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.storage)


def _unit_view(buf: torch.Tensor, layout: MemLayout, i: int) -> torch.Tensor:
    """The i-th unit of a layout buffer as [page, row-in-page, elems]."""
    if layout is MemLayout.layer_first:
        return buf[i]
    if layout is MemLayout.page_first:
        return buf[:, :, i]
    return buf[:, i]


def host_buffer(
    shape: tuple[int, ...], dtype: torch.dtype, pin_memory: bool, limit_bytes: int
) -> torch.Tensor:
    """A host buffer, pinned when asked: by torch up to `limit_bytes`, else allocated pageable
    and registered with the CUDA driver in one piece (the registration lives as long as the
    process). One piece: a copy spanning two registrations fails (cudaErrorInvalidValue),
    and a run of pages may lie anywhere in the pool."""
    if not pin_memory or math.prod(shape) * dtype.itemsize <= limit_bytes:
        return torch.empty(shape, dtype=dtype, pin_memory=pin_memory)
    buf = torch.empty(shape, dtype=dtype)
    portable_mapped = 0x01 | 0x02  # every device sees it, and at the same address (UVA)
    error = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.nbytes, portable_mapped)
    if int(error) != 0:
        raise RuntimeError(f"cudaHostRegister of {buf.nbytes} B failed with CUDA error {error}")
    return buf


class _CudaArray:
    """Exposes a pinned host buffer through __cuda_array_interface__ (UVA: same address)."""

    def __init__(self, host: torch.Tensor) -> None:
        self.__cuda_array_interface__ = {
            "shape": (host.nbytes,),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "version": 3,
        }


def uva_alias(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A cuda tensor over the same pinned host memory, so gather/scatter kernels reach it."""
    assert host.is_pinned() and host.is_contiguous(), "UVA aliases whole pinned buffers"
    flat = torch.as_tensor(_CudaArray(host), device=device)
    return flat.view(host.dtype).view(host.shape)
