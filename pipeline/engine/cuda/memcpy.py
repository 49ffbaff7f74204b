"""One copy call per run of pages, whatever the page stride of the host layout.

A run of n pages of one layer is n equally spaced, contiguous blocks on each side (spaced by the
layout's page stride). On CPU a strided tensor copy does it. On cuda `Tensor.copy_` would
stage a non-contiguous host view through pageable memory (slow, and a sync), so a strided run
goes to the copy engine as one `cudaMemcpy2DAsync` on the current stream instead.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from pipeline.engine.cuda.cudart import bound


class Pages(NamedTuple):
    """A [pages, rows, elems] view whose pages are each contiguous, with what a copy call needs
    of it as plain integers (read once: tensor accessors cost the issue path per call)."""

    view: torch.Tensor | None
    """The tensor, for the CPU copier; None where `StackPages` made it for cuda, whose
    copier takes the integers alone."""
    address: int
    pitch: int
    """Bytes from one page to the next."""
    width: int
    """Bytes of one page."""
    block: bool
    """Each page is one contiguous block, as a copy call on cuda needs (every layout but
    page_first, whose page interleaves the units row by row; on CPU a tensor copy takes any)."""


def pages_view(view: torch.Tensor) -> Pages:
    item = view.element_size()
    width = math.prod(view.shape[1:]) * item
    return Pages(view, view.data_ptr(), view.stride(0) * item, width, view[0:1].is_contiguous())


class StackPages(NamedTuple):
    """Units stacked [units, pages, rows, elems] in one buffer, as plain integers: a copy call
    of a run of pages of every unit is made from them without slicing a tensor (`run`, where
    each unit's pages lie end to end; else a batch, from `unit_addresses`)."""

    view: torch.Tensor
    address: int
    unit_pitch: int
    page_pitch: int
    page_width: int
    page_block: bool
    """A unit's page is one contiguous block (see `Pages.block`)."""
    views: bool
    """The copier takes views (CPU): `run` slices `view` for it."""
    units: int
    unit_addresses: np.ndarray
    """Each unit's first byte (int64): a batch copy's addresses are one add from them."""

    def run(self, page: int, pages: int) -> Pages:
        """Each unit's `pages` pages from `page` as one block (a layer-first layout)."""
        view = self.view[:, page : page + pages] if self.views else None
        address = self.address + page * self.page_pitch
        block = self.page_block and self.page_pitch == self.page_width
        return Pages(view, address, self.unit_pitch, pages * self.page_width, block)


def stack_pages(view: torch.Tensor) -> StackPages:
    item = view.element_size()
    return StackPages(
        view,
        view.data_ptr(),
        view.stride(0) * item,
        view.stride(1) * item,
        math.prod(view.shape[2:]) * item,
        view[0, 0:1].is_contiguous(),
        view.device.type == "cpu",
        view.shape[0],
        view.data_ptr() + np.arange(view.shape[0], dtype=np.int64) * (view.stride(0) * item),
    )


CopyPages = Callable[[Pages, int, Pages, int, int], None]
"""copy(dst, dst_page, src, src_page, count): `count` pages between two page-wise views."""

CUDA_MEMCPY_DEFAULT = 4
"""cudaMemcpyDefault: the direction follows from the (unified) addresses."""


def copy_pages_cpu(dst: Pages, dst_page: int, src: Pages, src_page: int, count: int) -> None:
    assert dst.view is not None and src.view is not None, "CPU views carry their tensor"
    dst.view[dst_page : dst_page + count].copy_(src.view[src_page : src_page + count])


Upload = Callable[[np.ndarray, torch.Tensor | None], torch.Tensor]
"""upload(src, dst): a transfer's page ids (a host int64 array) into `dst`, a contiguous
int64 tensor of src's size on the device (a new one where None), on the current stream;
`src` may be freed once it returns. Returns `dst`."""


def upload_cpu(src: np.ndarray, dst: torch.Tensor | None) -> torch.Tensor:
    """On CPU the array's own memory serves (no copy), or is copied into `dst`."""
    return torch.from_numpy(src) if dst is None else dst.copy_(torch.from_numpy(src))


def cuda_uploader(cudart: ctypes.CDLL, device: torch.device) -> Upload:
    """One cudaMemcpyAsync from pageable memory, which the runtime stages before it returns
    (so `src` may go at once). torch's copy from a CPU tensor costs the issue path much more
    once a transfer has flushed the host's caches (BENCHMARKS.md, issue time)."""
    current_stream = torch._C._cuda_getCurrentRawStream
    ptr, size, kind = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    memcpy = bound(cudart.cudaMemcpyAsync, ptr, ptr, size, kind, ptr)

    def upload(src: np.ndarray, dst: torch.Tensor | None) -> torch.Tensor:
        if dst is None:
            dst = torch.empty(src.shape, dtype=torch.int64, device=device)
        assert src.dtype == np.int64 and dst.dtype == torch.int64, "page ids are int64"
        assert dst.is_contiguous() and src.flags.c_contiguous, "one block on both sides"
        assert dst.numel() == src.size, "as many ids on both sides"
        stream = current_stream(device.index)
        error = memcpy(dst.data_ptr(), src.ctypes.data, src.nbytes, CUDA_MEMCPY_DEFAULT, stream)
        if error:
            raise RuntimeError(f"cudaMemcpyAsync (page ids) failed with CUDA error {error}")
        return dst

    return upload


def cuda_copier(cudart: ctypes.CDLL, device_index: int) -> CopyPages:
    """One cudaMemcpy2DAsync per strided run (cudaMemcpyAsync where both sides are one
    block), from the views' integers alone."""
    # the raw handle of the current stream without torch.cuda.current_stream()'s Python
    # device lookups (tens of microseconds per call, on every copy of the issue path)
    current_stream = torch._C._cuda_getCurrentRawStream
    ptr, size, kind = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int  # a stream is a ptr
    memcpy = bound(cudart.cudaMemcpyAsync, ptr, ptr, size, kind, ptr)
    memcpy2d = bound(cudart.cudaMemcpy2DAsync, ptr, size, ptr, size, size, size, kind, ptr)

    def copy(dst: Pages, dst_page: int, src: Pages, src_page: int, count: int) -> None:
        # plain integers only: no sliced tensors, no accessors on the issue path
        _, dst_at, dst_pitch, width, dst_block = dst
        _, src_at, src_pitch, _, src_block = src
        assert dst_block and src_block, "a copy call moves pages that are each one block"
        dst_at += dst_page * dst_pitch
        src_at += src_page * src_pitch
        stream = current_stream(device_index)
        if dst_pitch == src_pitch == width:  # one block on both sides
            error = memcpy(dst_at, src_at, width * count, CUDA_MEMCPY_DEFAULT, stream)
        else:
            error = memcpy2d(
                dst_at, dst_pitch, src_at, src_pitch, width, count, CUDA_MEMCPY_DEFAULT, stream
            )
        if error:
            raise RuntimeError(f"cudaMemcpy(2D)Async failed with CUDA error {error}")

    return copy
