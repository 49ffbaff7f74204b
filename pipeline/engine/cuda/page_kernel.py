"""Move pages between two page-wise views by page ids (or from a first page): one kernel.

A kernel step used to be torch's `index_select` then `index_copy_`: two kernels and two trips
through torch's dispatcher, each costing the host more than a whole launch here (BENCHMARKS.md,
issue time), per layer group of every transfer. On cuda `PageKernel` gathers and scatters in one
launch made from integers (`cudaLaunchKernel` through ctypes), compiled by NVRTC once per
engine (its `Runtime`). On CPU `move_pages_cpu` does the same with torch's index ops.

A view is [pages, rows, words] (`dim` 0) or [units, pages, rows, words] (`dim` 1, units of
one pool kind stacked in one buffer); the pages of `dst` and `src` hold the same bytes, laid
out as rows that may be spaced apart on either side (a page_first host interleaves them).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch

from pipeline.engine.cuda.cudart import bound
from pipeline.engine.cuda.stacks import remembered

PageAt = torch.Tensor | int
"""Where a step's pages are on one side: their page ids (an int64 tensor on the view's
device), or the first of as many consecutive pages."""

MovePages = Callable[[torch.Tensor, PageAt, torch.Tensor, PageAt, int, int], None]
"""move(dst, dst_at, src, src_at, dim, count): `count` pages of every unit of two views."""


def move_pages_cpu(
    dst: torch.Tensor, dst_at: PageAt, src: torch.Tensor, src_at: PageAt, dim: int, count: int
) -> None:
    """The same move with torch's index ops (one where one side is consecutive pages)."""
    if isinstance(dst_at, int):
        out = dst.narrow(dim, dst_at, count)
        if isinstance(src_at, int):
            out.copy_(src.narrow(dim, src_at, count))
        else:
            torch.index_select(src, dim, src_at, out=out)
        return
    source = (
        src.narrow(dim, src_at, count) if isinstance(src_at, int) else src.index_select(dim, src_at)
    )
    dst.index_copy_(dim, dst_at, source)


SOURCE = r"""
struct __align__(16) Bytes16 { unsigned long long lo, hi; };

template <typename T>
__device__ void move_rows(char* to, const char* from, long long rows, long long to_row,
                          long long from_row, long long row_bytes) {
    const long long per_row = row_bytes / (long long)sizeof(T);
    if (rows == 1) {
        T* out = reinterpret_cast<T*>(to);
        const T* in = reinterpret_cast<const T*>(from);
        for (long long i = threadIdx.x; i < per_row; i += blockDim.x) out[i] = in[i];
        return;
    }
    for (long long i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        const long long r = i / per_row, c = i - r * per_row;
        const T* in = reinterpret_cast<const T*>(from + r * from_row);
        reinterpret_cast<T*>(to + r * to_row)[c] = in[c];
    }
}

// One block per (page, unit): page ids from `*_ids`, or `*_first + page` where that is null.
extern "C" __global__ void move_pages(
    char* dst, const long long* dst_ids, long long dst_first, long long dst_unit,
    long long dst_page, long long dst_row,
    const char* src, const long long* src_ids, long long src_first, long long src_unit,
    long long src_page, long long src_row,
    long long rows, long long row_bytes) {
    const long long p = blockIdx.x, u = blockIdx.y;
    const long long d = dst_ids ? dst_ids[p] : dst_first + p;
    const long long s = src_ids ? src_ids[p] : src_first + p;
    char* to = dst + u * dst_unit + d * dst_page;
    const char* from = src + u * src_unit + s * src_page;
    if (dst_row == row_bytes && src_row == row_bytes) {  // the page is one block on both sides
        row_bytes *= rows;
        rows = 1;
    }
    const unsigned long long spans = (unsigned long long)to | (unsigned long long)from |
        (unsigned long long)(dst_row | src_row | row_bytes);
#define MOVE(T) move_rows<T>(to, from, rows, dst_row, src_row, row_bytes)
    if ((spans & 15) == 0) MOVE(Bytes16);
    else if ((spans & 7) == 0) MOVE(unsigned long long);
    else if ((spans & 3) == 0) MOVE(unsigned int);
    else MOVE(unsigned char);
}
"""

THREADS = 256
"""Threads per (page, unit) block: 4 KiB per pass in 16-byte words (a 72 KiB MLA page: 18)."""

ARGS = 14
"""The kernel's parameters, each 8 bytes (pointers and long longs)."""


class Dim3(ctypes.Structure):
    """CUDA's dim3, passed by value to cudaLaunchKernel."""

    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def compiled_ptx(device: torch.device) -> bytes:
    """`SOURCE` as PTX for `device`'s architecture (NVRTC, through torch's loader of it)."""
    from torch.cuda._utils import _nvrtc_compile  # torch's binding of NVRTC (cuda builds)

    major, minor = torch.cuda.get_device_capability(device)
    ptx, _ = _nvrtc_compile(SOURCE, "move_pages", f"{major}{minor}")
    return ptx


class PageKernel:
    """`move_pages` on cuda, loaded into torch's CUDA runtime (its context, its streams)."""

    def __init__(self, cudart: ctypes.CDLL, device: torch.device) -> None:
        ptr, uint, handle = ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)
        load = bound(cudart.cudaLibraryLoadData, handle, ptr, ptr, ptr, uint, ptr, ptr, uint)
        get = bound(cudart.cudaLibraryGetKernel, handle, ptr, ctypes.c_char_p)
        self._launch = bound(cudart.cudaLaunchKernel, ptr, Dim3, Dim3, ptr, ctypes.c_size_t, ptr)
        self.device_index = device.index
        self._current_stream = torch._C._cuda_getCurrentRawStream
        self._ptx = ctypes.create_string_buffer(compiled_ptx(device))
        library, kernel = ctypes.c_void_p(), ctypes.c_void_p()
        error = load(ctypes.byref(library), self._ptx, None, None, 0, None, None, 0)
        self._check(error, "cudaLibraryLoadData")
        self._check(get(ctypes.byref(kernel), library, b"move_pages"), "cudaLibraryGetKernel")
        self._kernel = kernel.value
        self._block = Dim3(THREADS, 1, 1)
        # one argument buffer and grid, filled per launch (building them cost the host more
        # than the rest of a call): the launch reads them with the GIL released, so a lock
        # keeps another thread's launch from refilling them meanwhile
        self._lock = threading.Lock()
        self._args = (ctypes.c_uint64 * ARGS)()
        base = ctypes.addressof(self._args)
        self._params = (ctypes.c_void_p * ARGS)(*range(base, base + 8 * ARGS, 8))
        self._grid = Dim3(1, 1, 1)
        self._layouts: dict[int, tuple[torch.Tensor, tuple[int, ...]]] = {}
        """By view (`remembered`): its parameters but the page ids (`_side`). The pools' and
        batches' views recur on every step, and reading a tensor's strides costs the issue
        path per launch."""

    @staticmethod
    def _check(error: int, call: str) -> None:
        if error:
            raise RuntimeError(f"move_pages: {call} failed with CUDA error {error}")

    def __call__(
        self,
        dst: torch.Tensor,
        dst_at: PageAt,
        src: torch.Tensor,
        src_at: PageAt,
        dim: int,
        count: int,
    ) -> None:
        if count == 0:
            return
        assert dst.dim() == src.dim() == dim + 3, "a view's rank says its page dimension"
        rows, row_bytes, *to = remembered(self._layouts, dst, _side)
        src_rows, src_bytes, *source = remembered(self._layouts, src, _side)
        assert (rows, row_bytes) == (src_rows, src_bytes), "both sides' pages hold the same rows"
        to[1:3], source[1:3] = _at(dst_at), _at(src_at)  # fresh lists: the starred names
        stream = self._current_stream(self.device_index)
        with self._lock:
            # ctypes takes ints here; its stubs want c_uint64s
            self._args[:] = (*to, *source, rows, row_bytes)  # type: ignore[call-overload]
            grid = self._grid
            grid.x, grid.y = count, dst.shape[0] if dim else 1  # a block per (page, unit)
            error = self._launch(self._kernel, grid, self._block, self._params, 0, stream)
        self._check(error, "launch")


def _side(view: torch.Tensor) -> tuple[int, ...]:
    """(rows of a page, bytes of a row, then the kernel's six parameters of this side:
    address, ids address (0 here), first page (0 here), unit pitch, page pitch, row pitch;
    pitches in bytes). A view's page dimension follows from its rank: [pages, rows, words]
    (0) or [units, pages, rows, words] (1)."""
    dim = view.dim() - 3
    item = view.element_size()
    strides = view.stride()
    (rows, words), (row_stride, word_stride) = view.shape[dim + 1 :], strides[dim + 1 :]
    assert word_stride == 1, "a page is [rows, words] of contiguous rows"
    unit = strides[0] * item if dim else 0
    address = view.data_ptr()
    return rows, words * item, address, 0, 0, unit, strides[dim] * item, row_stride * item


def _at(at: PageAt) -> tuple[int, int]:
    """(ids address, first page) of one side: its page ids, or its first page."""
    if isinstance(at, int):
        return 0, at
    assert at.dtype == torch.int64 and at.is_cuda, "page ids are int64 on the device"
    return at.data_ptr(), 0
