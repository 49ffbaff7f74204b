"""The batch copier's tables, on CPU: laid out as CUDA's cudaMemcpy3DBatchOp, and naming the
bytes the CPU copier moves (each table run here row by row with memmove on real tensors), for
runs longer and shorter than the units, both directions, one set of tables refilled.
`tests/gpu/test_memcpy_batch_gpu.py` runs the same tables through the runtime."""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest
import torch

from pipeline.engine.cuda import memcpy_batch
from pipeline.engine.cuda.memcpy import stack_pages
from pipeline.engine.cuda.memcpy_batch import (
    ACCESS_ORDER_STREAM,
    BATCH_OP,
    OPERAND_POINTER,
    Batch,
    Batches,
    batch_call,
    cpu_stack_copier,
)

UNITS, PAGES, WIDTH = 5, 16, 24  # bytes of a page of one unit
STREAM = 0x5000  # a stream's handle (0 is the legacy default stream)
NAMES = BATCH_OP.names or ()


def test_a_table_row_is_laid_out_as_cudas_batch_op() -> None:
    """struct cudaMemcpy3DBatchOp { cudaMemcpy3DOperand src, dst; cudaExtent extent;
    cudaMemcpySrcAccessOrder srcAccessOrder; unsigned int flags; }, an operand being
    { type; union { struct { void *ptr; size_t rowLength, layerHeight; cudaMemLocation
    locHint; } ptr; ... } op; } (40 bytes, the union 8-aligned)."""
    fields = BATCH_OP.fields
    assert fields is not None
    offsets = {name: fields[name][1] for name in NAMES}
    assert BATCH_OP.itemsize == 112
    assert [offsets[k] for k in ("src_type", "src", "src_pitch", "src_rows", "src_hint")] == [
        0,
        8,
        16,
        24,
        32,
    ]
    assert [offsets[k] for k in ("dst_type", "dst", "dst_pitch", "dst_rows", "dst_hint")] == [
        40,
        48,
        56,
        64,
        72,
    ]
    assert [offsets[k] for k in ("width", "height", "depth", "order", "flags")] == [
        80,
        88,
        96,
        104,
        108,
    ]


def run(batch: Batch) -> None:
    """The table's copies, row by row (what the runtime does with it)."""
    for op in batch.table.tolist():
        fields = dict(zip(NAMES, op, strict=True))
        assert fields["src_type"] == fields["dst_type"] == OPERAND_POINTER
        assert (fields["depth"], fields["order"], fields["flags"]) == (1, ACCESS_ORDER_STREAM, 0)
        assert fields["src_rows"] == fields["dst_rows"] == fields["height"]
        for row in range(fields["height"]):
            dst = fields["dst"] + row * fields["dst_pitch"]
            src = fields["src"] + row * fields["src_pitch"]
            ctypes.memmove(dst, src, fields["width"])


def test_each_table_moves_what_the_cpu_copier_moves() -> None:
    batches = Batches()  # one set of tables for every case: each refilled, reshaped
    for load, count in itertools.product([False, True], [1, 3, UNITS, 11, 1]):
        host = torch.randint(0, 256, (PAGES, UNITS, WIDTH), dtype=torch.uint8)
        device = torch.randint(0, 256, (UNITS, PAGES, WIDTH), dtype=torch.uint8)
        want_host, want_device = host.clone(), device.clone()
        host_page, device_page = 4, 1
        sides = [
            (stack_pages(device), device_page, stack_pages(host.transpose(0, 1)), host_page),
            (
                stack_pages(want_device),
                device_page,
                stack_pages(want_host.transpose(0, 1)),
                host_page,
            ),
        ]
        if not load:  # the host is written
            sides = [(src, src_page, dst, dst_page) for dst, dst_page, src, src_page in sides]
        batch = batches.filled(*sides[0], count)
        assert len(batch.table) == min(UNITS, count)
        run(batch)
        cpu_stack_copier(2)(*sides[1], count)
        assert torch.equal(host, want_host), (load, count)
        assert torch.equal(device, want_device), (load, count)


class Runtime:
    """The four cudart functions the batch copier calls, doing on CPU addresses what CUDA's
    do (each a plain function, as ctypes' are, so `bound` can declare its types)."""

    def __init__(self, version: int, refuse: int = 0) -> None:
        self.calls: list[str] = []

        def cudaRuntimeGetVersion(out) -> int:
            out._obj.value = version
            return 0

        def cudaMemcpy3DBatchAsync(n, address, *rest) -> int:
            # CUDA 13: (flags, stream); 12.8: (failIdx, flags, stream)
            self.calls.append(f"batch/{len(rest)}")
            if refuse:
                return refuse
            raw = (ctypes.c_char * (n * BATCH_OP.itemsize)).from_address(address)
            table = Batch(n)
            table.table[:] = np.frombuffer(raw, BATCH_OP)
            run(table)
            return 0

        def cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, kind, stream):
            self.calls.append("2d")
            for row in range(height):
                ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)
            return 0

        def cudaGetLastError() -> int:
            self.calls.append("last_error")
            return 0

        for fn in (cudaRuntimeGetVersion, cudaMemcpy3DBatchAsync, cudaMemcpy2DAsync):
            setattr(self, fn.__name__, fn)
        self.cudaGetLastError = cudaGetLastError


@pytest.mark.parametrize(
    ("version", "refuse", "calls"),
    [
        (13000, 0, ["batch/2"] * 2),
        (12080, 0, ["batch/3"] * 2),
        (12060, 0, ["2d"] * 2 * UNITS),  # before the batch call: one by one
        (13000, 801, ["batch/2", "last_error", *["2d"] * 2 * UNITS]),  # refused once
    ],
)
def test_the_runtime_gets_the_batch_call_its_version_has_or_the_copies_one_by_one(
    version, refuse, calls, caplog
) -> None:
    runtime = Runtime(version, refuse)
    issue = batch_call(runtime)  # type: ignore[arg-type]  # the runtime's functions
    for _ in range(2):  # a second call: after a refusal, one by one without asking again
        host = torch.randint(0, 256, (PAGES, UNITS, WIDTH), dtype=torch.uint8)
        device = torch.randint(0, 256, (UNITS, PAGES, WIDTH), dtype=torch.uint8)
        want = host.clone()
        cpu_stack_copier(2)(stack_pages(want.transpose(0, 1)), 2, stack_pages(device), 3, 7)
        batch = Batches().filled(stack_pages(host.transpose(0, 1)), 2, stack_pages(device), 3, 7)
        issue(batch, STREAM)
        assert torch.equal(host, want)
    assert runtime.calls == calls
    assert ("copying one by one" in caplog.text) == bool(refuse)


def test_the_legacy_default_stream_gets_the_copies_one_by_one() -> None:
    """The batch call refuses the legacy default stream: no refusal, no warning, no switch."""
    runtime = Runtime(13000)
    issue = batch_call(runtime)  # type: ignore[arg-type]  # the runtime's functions
    host = torch.zeros((PAGES, UNITS, WIDTH), dtype=torch.uint8)
    device = torch.randint(1, 256, (UNITS, PAGES, WIDTH), dtype=torch.uint8)
    issue(Batches().filled(stack_pages(host.transpose(0, 1)), 0, stack_pages(device), 0, 7), 0)
    issue(Batches().filled(stack_pages(host.transpose(0, 1)), 0, stack_pages(device), 0, 7), STREAM)
    assert runtime.calls == [*["2d"] * UNITS, "batch/2"]
    assert torch.equal(host[:7].transpose(0, 1), device[:, :7])


def test_a_cpu_rank_copies_blocks_natively_and_rows_as_a_tensor(monkeypatch) -> None:
    """Page-major host to layer-major device: one native call of every unit's page blocks
    (`_blocks.copy_blocks`), bit-exact; a host page whose units interleave row by row
    (page_first) is no block, and goes as a strided tensor copy instead."""
    calls: list[int] = []
    native = memcpy_batch.copy_blocks

    def counted(dst, src, width, threads):  # type: ignore[no-untyped-def]
        calls.append(len(dst))
        native(dst, src, width, threads)

    monkeypatch.setattr(memcpy_batch, "copy_blocks", counted)
    copy = cpu_stack_copier(2)
    host = torch.randint(0, 256, (PAGES, UNITS, WIDTH), dtype=torch.uint8)
    device = torch.zeros((UNITS, PAGES, WIDTH), dtype=torch.uint8)
    copy(stack_pages(device), 3, stack_pages(host.transpose(0, 1)), 2, 7)
    assert calls == [UNITS * 7] and torch.equal(device[:, 3:10], host[2:9].transpose(0, 1))
    rows = torch.randint(0, 256, (PAGES, WIDTH // 4, UNITS, 4), dtype=torch.uint8)
    interleaved = rows.permute(2, 0, 1, 3).reshape(UNITS, PAGES, WIDTH // 4, 4)
    copy(stack_pages(device.view(UNITS, PAGES, WIDTH // 4, 4)), 0, stack_pages(interleaved), 0, 5)
    assert calls == [UNITS * 7]
    assert torch.equal(device.view(UNITS, PAGES, WIDTH // 4, 4)[:, :5], interleaved[:, :5])
