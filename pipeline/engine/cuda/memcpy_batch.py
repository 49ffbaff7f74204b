"""A run of pages of every stacked unit in one copy call, whatever the two stacks' strides.

A unit's run is one block on neither side where the host keeps a page's units together
(page_first_direct): the direct backend made one strided DMA per unit, 61 calls per run for
deepseek_v3, each costing the host more than the bytes it moves (BENCHMARKS.md, issue time).
On cuda the run goes to the copy engine as one `cudaMemcpy3DBatchAsync` of 2D copies: one per
unit (its `count` pages), or one per page (that page of every unit) where the run has fewer
pages than units. A runtime without the batch call (before CUDA 12.8) issues the same 2D
copies one by one. On CPU the blocks are copied natively (`cpu_stack_copier`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipeline.engine.cuda._blocks import copy_blocks
from pipeline.engine.cuda.cudart import bound
from pipeline.engine.cuda.memcpy import CUDA_MEMCPY_DEFAULT, StackPages

log = logging.getLogger("hicache-pipeline")

CopyStacks = Callable[[StackPages, int, StackPages, int, int], None]
"""copy(dst, dst_page, src, src_page, count): `count` pages of every unit of two stacks of the
same units, in one call."""

BATCH_OP = np.dtype(
    [  # cudaMemcpy3DBatchOp: two pointer operands, an extent, the source's access order
        ("src_type", "<i4"),
        ("src_pad", "<i4"),
        ("src", "<i8"),  # a pointer: user space addresses fit in int64
        ("src_pitch", "<u8"),  # rowLength: bytes, as a pointer operand's element is a byte
        ("src_rows", "<u8"),  # layerHeight
        ("src_hint", "<u8"),  # cudaMemLocation, unused for these pointers
        ("dst_type", "<i4"),
        ("dst_pad", "<i4"),
        ("dst", "<i8"),
        ("dst_pitch", "<u8"),
        ("dst_rows", "<u8"),
        ("dst_hint", "<u8"),
        ("width", "<u8"),
        ("height", "<u8"),
        ("depth", "<u8"),
        ("order", "<i4"),
        ("flags", "<u4"),
    ]
)
OPERAND_POINTER = 1
"""cudaMemcpyOperandTypePointer."""
ACCESS_ORDER_STREAM = 1
"""cudaMemcpySrcAccessOrderStream: the source is read in stream order, as any async copy."""
BATCH_RUNTIME = 12080
"""The first CUDA runtime with cudaMemcpy3DBatchAsync; 13.0 dropped its failIdx argument."""


def cpu_stack_copier(threads: int) -> CopyStacks:
    """A CPU rank's copier: where each unit's page is one block on both sides, the blocks
    natively, past the CPU's caches, on `threads` threads (`_blocks`: a third less memory
    traffic than a tensor copy, whose stores first fetch each line they overwrite); else a
    strided tensor copy."""

    def copy(dst: StackPages, dst_page: int, src: StackPages, src_page: int, count: int) -> None:
        if not (dst.page_block and src.page_block):
            dst.view[:, dst_page : dst_page + count].copy_(src.view[:, src_page : src_page + count])
            return
        pages = np.arange(count, dtype=np.int64)
        to = dst.unit_addresses[:, None] + (dst_page + pages) * dst.page_pitch
        at = src.unit_addresses[:, None] + (src_page + pages) * src.page_pitch
        copy_blocks(to.reshape(-1), at.reshape(-1), dst.page_width, threads)

    return copy


class Batch:
    """A table of `n` 2D copies, made once per `n`: the fields each call fills kept as views
    of it, and the rows and pitches it was last given (set only when they change)."""

    __slots__ = ("address", "dst", "shape", "src", "table")

    def __init__(self, n: int) -> None:
        self.table = np.zeros(n, BATCH_OP)
        self.table["src_type"] = self.table["dst_type"] = OPERAND_POINTER
        self.table["depth"], self.table["order"] = 1, ACCESS_ORDER_STREAM
        self.address: int = self.table.ctypes.data
        self.src, self.dst = self.table["src"], self.table["dst"]
        self.shape = (0, 0, 0, 0)
        """(src pitch, dst pitch, width, height) of every copy."""

    def shaped(self, src_pitch: int, dst_pitch: int, width: int, height: int) -> None:
        """Every copy `height` rows of `width` bytes, the rows `*_pitch` bytes apart."""
        shape = (src_pitch, dst_pitch, width, height)
        if self.shape != shape:
            table = self.table
            table["src_pitch"], table["dst_pitch"], table["width"] = src_pitch, dst_pitch, width
            table["height"] = table["src_rows"] = table["dst_rows"] = height
            self.shape = shape


class Batches:
    """One copier's tables, by number of copies (a stack's units, or fewer pages): each is
    read by the runtime before its call returns, so the next call may refill it."""

    def __init__(self) -> None:
        self._tables: dict[int, Batch] = {}

    def filled(
        self, dst: StackPages, dst_page: int, src: StackPages, src_page: int, count: int
    ) -> Batch:
        """The copies of `count` pages of every unit: one per unit (its pages, as rows a page
        pitch apart), or one per page (its units, as rows a unit pitch apart) where there are
        fewer pages than units."""
        assert dst.page_block and src.page_block, "a copy call moves pages that are each one block"
        assert dst.page_width == src.page_width, "the same units on both sides"
        units = dst.units
        n = min(units, count)
        batch = self._tables.get(n)
        if batch is None:
            batch = self._tables[n] = Batch(n)
        width = dst.page_width
        if count >= units:
            batch.shaped(src.page_pitch, dst.page_pitch, width, count)
            np.add(src.unit_addresses, src_page * src.page_pitch, out=batch.src)
            np.add(dst.unit_addresses, dst_page * dst.page_pitch, out=batch.dst)
        else:
            batch.shaped(src.unit_pitch, dst.unit_pitch, width, units)
            pages = np.arange(count, dtype=np.int64)
            np.multiply(pages, src.page_pitch, out=batch.src)
            batch.src += src.address + src_page * src.page_pitch
            np.multiply(pages, dst.page_pitch, out=batch.dst)
            batch.dst += dst.address + dst_page * dst.page_pitch
        return batch


Issue = Callable[[Batch, int], None]
"""issue(batch, stream): a filled table's copies on a raw stream."""


def cuda_stack_copier(
    cudart: ctypes.CDLL, device_index: int, issue: Issue | None = None
) -> CopyStacks:
    """One `cudaMemcpy3DBatchAsync` per call on the current stream (`Batches.filled`), from
    the stacks' integers alone; `issue` (default: `batch_call`) makes the call."""
    current_stream = torch._C._cuda_getCurrentRawStream
    issue = issue or batch_call(cudart)
    tables = Batches()

    def copy(dst: StackPages, dst_page: int, src: StackPages, src_page: int, count: int) -> None:
        issue(tables.filled(dst, dst_page, src, src_page, count), current_stream(device_index))

    return copy


def batch_call(cudart: ctypes.CDLL) -> Issue:
    """The runtime's batch call for a filled table; its copies one by one where it has none,
    on the legacy default stream (which the batch call refuses), and from the first call it
    refuses on (a driver older than the runtime, say), with one warning: a bad address fails
    those copies too, so no error is hidden."""
    version = ctypes.c_int()
    error = bound(cudart.cudaRuntimeGetVersion, ctypes.POINTER(ctypes.c_int))(ctypes.byref(version))
    if error:
        raise RuntimeError(f"cudaRuntimeGetVersion failed with CUDA error {error}")
    singly = one_by_one(cudart)
    if version.value < BATCH_RUNTIME:
        return singly
    ptr, size, flags = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulonglong
    fn = cudart.cudaMemcpy3DBatchAsync
    if version.value >= 13000:  # CUDA 13 dropped the failIdx argument
        batch = bound(fn, size, ptr, flags, ptr)
        fail_index: tuple[Any, ...] = ()
    else:
        batch = bound(fn, size, ptr, ctypes.POINTER(ctypes.c_size_t), flags, ptr)
        fail_index = (ctypes.byref(ctypes.c_size_t()),)
    refused: list[int] = []
    """The error of the first call the runtime refused (then every call goes one by one)."""

    def issue(b: Batch, stream: int) -> None:
        if stream and not refused:  # the legacy default stream's handle is 0
            error = batch(len(b.table), b.address, *fail_index, 0, stream)
            if not error:
                return
            refused.append(error)
            cudart.cudaGetLastError()  # not left for torch's next launch check to raise
            log.warning(
                "cudaMemcpy3DBatchAsync failed with CUDA error %d: copying one by one", error
            )
        singly(b, stream)

    return issue


def one_by_one(cudart: ctypes.CDLL) -> Issue:
    """The table's copies one `cudaMemcpy2DAsync` each (a runtime without the batch call)."""
    ptr, size, kind = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    memcpy2d = bound(cudart.cudaMemcpy2DAsync, ptr, size, ptr, size, size, size, kind, ptr)

    def issue(b: Batch, stream: int) -> None:
        src_pitch, dst_pitch, width, height = b.shape
        for src, dst in zip(b.src.tolist(), b.dst.tolist(), strict=True):
            error = memcpy2d(
                dst, dst_pitch, src, src_pitch, width, height, CUDA_MEMCPY_DEFAULT, stream
            )
            if error:
                raise RuntimeError(f"cudaMemcpy2DAsync failed with CUDA error {error}")

    return issue
