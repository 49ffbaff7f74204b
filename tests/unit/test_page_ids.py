"""The page id buffers an engine lends its transfers on cuda: lent again only once the last
holder's `done` is recorded and complete and it did not fail; none while every one is in use."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.cuda.memcpy import upload_cpu
from pipeline.engine.cuda.page_ids import BUFFERS, PageIdBuffers
from pipeline.engine.cuda.streams import CpuEvent

MOST = 8


def holder() -> SimpleNamespace:
    """A transfer as the buffers see it: its ack, and its error."""
    return SimpleNamespace(done=CpuEvent(1.0), error=None)


def test_a_buffer_is_lent_again_only_once_its_holder_is_done() -> None:
    buffers = PageIdBuffers(torch.device("cpu"), MOST)
    first = holder()
    lent = buffers.lend(first, 3)
    assert lent is not None
    others = [buffers.lend(holder(), 3) for _ in range(BUFFERS - 1)]
    assert all(o is not None and o[0].data_ptr() != lent[0].data_ptr() for o in others)
    assert buffers.lend(holder(), 3) is None  # every buffer in flight: the caller allocates
    first.done.set()
    again = buffers.lend(holder(), 3)
    assert again is not None and again[0].data_ptr() == lent[0].data_ptr()
    assert again[0] is lent[0]  # the views of a page count are made once


def test_a_failed_holders_buffer_is_never_lent_again() -> None:
    """Its kernels may still read the ids: a failed transfer's events complete at once."""
    buffers = PageIdBuffers(torch.device("cpu"), MOST)
    failed = holder()
    lent = buffers.lend(failed, 2)
    assert lent is not None
    failed.error = RuntimeError("a stage failed")
    failed.done.fail(failed.error)
    for _ in range(BUFFERS - 1):
        got = buffers.lend(holder(), 2)
        assert got is not None and got[0].data_ptr() != lent[0].data_ptr()
    assert buffers.lend(holder(), 2) is None


def test_the_rows_are_one_upload_of_both_sides_and_too_many_pages_get_none() -> None:
    buffers = PageIdBuffers(torch.device("cpu"), MOST)
    ids = np.array([[5, 1, 7], [0, 2, 4]], dtype=np.int64)
    lent = buffers.lend(holder(), 3)
    assert lent is not None
    both, host, device = lent
    assert both.is_contiguous() and both.shape == (2, 3)
    upload_cpu(ids, both)
    assert host.tolist() == [5, 1, 7] and device.tolist() == [0, 2, 4]
    assert buffers.lend(holder(), MOST + 1) is None


@pytest.mark.usefixtures("one_rank")
def test_transfers_with_lent_buffers_move_their_own_pages_bit_exact() -> None:
    """An engine lends on cuda only (on CPU the plan's array serves); here its CPU stand-in
    lends too, so scattered round trips on worker streams reuse buffers, each bit-exact."""
    job = pipeline.compose(
        [
            "model=tiny_mla",
            "topology=tp1",
            "topology.mem_layout=page_first",  # the kernel backend's pool
            "workload.num_tokens=64",
        ]
    )
    engine = pipeline.create_engine(job)
    buffers = PageIdBuffers(torch.device("cpu"), engine.sizing.device_pages)
    engine.resources = dataclasses.replace(engine.resources, page_id_buffers=buffers)
    lent: list[int] = []
    lend = buffers.lend

    def spy(holder, pages):  # type: ignore[no-untyped-def]
        rows = lend(holder, pages)
        assert rows is not None  # each transfer waited for: a buffer is free
        lent.append(rows[0].data_ptr())
        return rows

    buffers.lend = spy  # type: ignore[method-assign]
    size, rng = engine.sizing.slots_per_page, random.Random(3)
    try:
        for _ in range(4):
            host = engine.host_allocator.alloc(3, rng)
            source = rng.sample(range(engine.sizing.device_pages), 3)
            target = rng.sample(
                [p for p in range(engine.sizing.device_pages) if p not in source], 3
            )
            layers = [engine.device_pool.layer(u) for u in engine.model.units]
            for layer in layers:
                layer.copy_(torch.randn(layer.shape).to(layer.dtype))
            want = [layer[source].clone() for layer in layers]
            engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
            engine.load(page_tokens(host, size), page_tokens(target, size)).done().wait()
            assert all(torch.equal(layer[target], w) for layer, w in zip(layers, want, strict=True))
            engine.host_allocator.free(host)
        engine.poll()
    finally:
        engine.close()
    assert len(lent) == 8 and len(set(lent)) < len(lent)  # buffers were lent again
