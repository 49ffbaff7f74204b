"""`PageKernel` (one NVRTC-compiled launch per page move) against torch's index ops: every
side by ids or by first page, both page dimensions, rows spaced apart (a page_first host),
widths of every alignment, pinned host memory through its UVA alias, inside a CUDA graph."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.cuda.cudart import cuda_runtime
from pipeline.engine.cuda.memcpy import cuda_uploader
from pipeline.engine.cuda.page_kernel import PageKernel, move_pages_cpu
from pipeline.engine.transfer.pools import uva_alias

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def kernel() -> PageKernel:
    cudart = cuda_runtime(DEVICE)
    assert cudart is not None
    return PageKernel(cudart, DEVICE)


def views(dim: int, words: int, dtype: torch.dtype, spaced: bool, host: bool):
    """(dst on the device, src on the host or the device, src's CPU copy, the pinned buffer
    src may alias), each [.., 12 pages, 3 rows, words]; `spaced`: the source's rows 2 rows
    apart (an interleaved layout)."""
    lead = (4,) if dim else ()
    rows = 6 if spaced else 3
    cpu = torch.randint(0, 100, (*lead, 12, rows, words), dtype=torch.int32).to(dtype)
    pinned = cpu.pin_memory()  # held by the caller: the alias does not keep it alive
    src = uva_alias(pinned, DEVICE) if host else cpu.to(DEVICE)
    if spaced:
        src, cpu = src[..., ::2, :], cpu[..., ::2, :]
    dst = torch.zeros((*lead, 12, 3, words), dtype=dtype, device=DEVICE)
    return dst, src, cpu, pinned


@pytest.mark.parametrize(
    ("dim", "ids", "dtype", "words", "spaced", "host"),
    [
        *itertools.product(
            (0, 1),
            ("both", "dst", "src", "none"),
            (torch.int64,),
            (8,),
            (False, True),
            (False, True),
        ),
        *[
            (1, "both", dtype, words, False, True)
            for dtype, words in ((torch.int32, 3), (torch.int16, 5), (torch.uint8, 7))
        ],
    ],
)
def test_moves_what_torch_moves(kernel, dim, ids, dtype, words, spaced, host) -> None:
    dst, src, cpu, _pinned = views(dim, words, dtype, spaced, host)
    dst_pages, src_pages = [9, 0, 4, 7], [2, 11, 5, 6]
    if ids in ("src", "none"):
        dst_pages = [3, 4, 5, 6]
    if ids in ("dst", "none"):
        src_pages = [8, 9, 10, 11]
    as_at = {
        "dst": torch.tensor(dst_pages, device=DEVICE) if ids in ("both", "dst") else dst_pages[0],
        "src": torch.tensor(src_pages, device=DEVICE) if ids in ("both", "src") else src_pages[0],
    }
    want = torch.zeros(dst.shape, dtype=dtype)
    cpu_at = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in as_at.items()}
    move_pages_cpu(want, cpu_at["dst"], cpu, cpu_at["src"], dim, 4)
    kernel(dst, as_at["dst"], src, as_at["src"], dim, 4)
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu(), want)


def test_a_captured_move_reads_the_ids_it_finds_at_replay(kernel) -> None:
    dst, src, cpu, _pinned = views(1, 8, torch.int64, False, True)
    ids = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    stream = torch.cuda.Stream(DEVICE)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        kernel(dst, 0, src, ids, 1, 4)  # warm, outside the capture
        with torch.cuda.graph(graph, stream=stream):
            kernel(dst, 0, src, ids, 1, 4)
    ids.copy_(torch.tensor([5, 1, 10, 3]))
    dst.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst.cpu()[:, :4], cpu[:, [5, 1, 10, 3]])


class IndexOps(TorchDispatchMode):
    """Counts torch's gather/scatter ops a block issues (what `move_pages` replaces)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += str(func.overloadpacket) in ("aten.index_select", "aten.index_copy_")
        return func(*args, **(kwargs or {}))


def kernel_engine(*overrides: str) -> pipeline.Engine:
    """A one-GPU tiny_mla engine on the kernel backend, its device pages random bytes."""
    engine = pipeline.create_engine(
        pipeline.compose(
            [
                "model=tiny_mla",
                "topology=tp1",
                "topology.device=cuda",
                "topology.io_backend=kernel",
                "topology.mem_layout=layer_first",
                *overrides,
            ]
        )
    )
    for unit in engine.spec.units:
        layer = engine.device_pool.layer(unit).view(torch.uint8)
        layer.copy_(torch.randint(0, 256, layer.shape, dtype=torch.uint8))
    return engine


def round_trip(
    engine: pipeline.Engine, host: list[int], source: list[int], target: list[int]
) -> None:
    """Back up `source`'s device pages to `host` and load them into `target`, the forward
    stream waiting for each (no host wait)."""
    size, forward = engine.sizing.slots_per_page, engine.runtime.forward_stream
    engine.host_allocator.claim(host)
    host_t, source_t, target_t = (page_tokens(p, size) for p in (host, source, target))
    forward.wait_event(engine.backup(host_t, source_t))
    handle = engine.load(host_t, target_t)
    engine.begin_forward(forward)
    forward.wait_event(handle.done(forward))


def assert_landed(engine: pipeline.Engine, pairs: list[tuple[list[int], list[int]]]) -> None:
    """Each target's pages hold its source's bytes, in every unit."""
    torch.cuda.synchronize()
    for unit in engine.spec.units:
        layer = engine.device_pool.layer(unit).view(torch.uint8)  # bytes: bf16 holds NaNs
        for source, target in pairs:
            assert torch.equal(layer[target].cpu(), layer[source].cpu()), (unit, source, target)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("chunk", [0, 2])
def test_a_fragmented_kernel_transfer_issues_no_torch_index_op_and_lands_bit_exact(chunk) -> None:
    """What the bench's fragmented kernel rows claim for the new side: every gather/scatter is
    the page kernel's launch, none torch's, and the pages come back as they left."""
    engine = kernel_engine(f"strategy.chunk_pages={chunk}", "workload.num_tokens=256")
    source, target = [9, 3, 7, 1], [2, 8, 4, 6]
    with IndexOps() as ops:
        round_trip(engine, [0, 2, 4, 6], source, target)
    assert ops.count == 0
    assert_landed(engine, [(source, target)])
    engine.close()


@pytest.mark.usefixtures("one_rank")
def test_transfers_issued_back_to_back_read_their_own_ids_from_lent_buffers() -> None:
    """Eight scattered round trips issued without a host wait, more than the engine's four
    id buffers: a buffer is lent again only once its transfer is done, so every load lands
    its own pages (written on 2026-12-04 when no GPU was lent: not yet run)."""
    engine = kernel_engine(
        "strategy.cuda_graph_cache=0",  # eager: each transfer uploads its own ids
        "workload.num_tokens=1024",
        "workload.device_tokens=4096",
    )
    assert engine.resources.page_id_buffers is not None  # lent on cuda
    rounds = 8
    host = random.Random(1).sample(range(engine.sizing.host.num_pages), 2 * rounds)
    device = random.Random(2).sample(range(engine.sizing.device_pages), 4 * rounds)
    pairs = []
    for i in range(rounds):
        source, target = device[4 * i : 4 * i + 2], device[4 * i + 2 : 4 * i + 4]
        round_trip(engine, host[2 * i : 2 * i + 2], source, target)
        pairs.append((source, target))
    assert_landed(engine, pairs)
    engine.close()


def test_page_ids_upload_from_memory_the_caller_may_reuse_at_once() -> None:
    """`cuda_uploader`: the ids land bit-exact in a new tensor or a given one, and the source
    array may be overwritten as soon as the call returns (the runtime staged it), even with
    the stream still busy."""
    cudart = cuda_runtime(DEVICE)
    assert cudart is not None
    upload = cuda_uploader(cudart, DEVICE)
    stream = torch.cuda.Stream(DEVICE)
    busy = torch.empty(1 << 28, dtype=torch.uint8, device=DEVICE)
    rows = np.stack([np.arange(300, dtype=np.int64), np.arange(300, dtype=np.int64)[::-1] * 7])
    want = torch.from_numpy(rows.copy())
    given = torch.zeros(rows.shape, dtype=torch.int64, device=DEVICE)
    with torch.cuda.stream(stream):
        busy.random_()  # the copies queue behind it
        made = upload(rows, None)
        assert upload(rows, given) is given
        rows[:] = -1  # reused at once
    stream.synchronize()
    assert torch.equal(made.cpu(), want) and torch.equal(given.cpu(), want)


def test_a_view_moved_again_takes_the_new_calls_pages(kernel) -> None:
    """The kernel remembers each view's layout (its strides, read once), never its pages:
    the same two views moved again by other ids, or from other first pages, land where
    the new call says."""
    dst, src, cpu, _pinned = views(1, 8, torch.int64, False, True)
    want = torch.zeros(dst.shape, dtype=torch.int64)
    calls = (([9, 0, 4, 7], 2), ([1, 2, 3, 5], [11, 6, 5, 0]), ([8, 10, 11, 6], 7))
    for dst_pages, src_at in calls:
        dst_ids = torch.tensor(dst_pages, device=DEVICE)
        at = src_at if isinstance(src_at, int) else torch.tensor(src_at, device=DEVICE)
        cpu_at = src_at if isinstance(src_at, int) else torch.tensor(src_at)
        move_pages_cpu(want, torch.tensor(dst_pages), cpu, cpu_at, 1, 4)
        kernel(dst, dst_ids, src, at, 1, 4)
        torch.cuda.synchronize()
        assert torch.equal(dst.cpu(), want), (dst_pages, src_at)
