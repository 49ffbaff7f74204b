"""`move_pages_cpu`: every combination of page ids and first pages on either side, both
page dimensions, moves exactly the named pages (the cuda kernel's own test: tests/gpu)."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.engine.cuda.page_kernel import move_pages_cpu


def reference(dst, dst_pages, src, src_pages, dim):
    for d, s in zip(dst_pages, src_pages, strict=True):
        dst.select(dim, d).copy_(src.select(dim, s))


@pytest.mark.parametrize(
    ("dim", "dst_ids", "src_ids"), list(itertools.product((0, 1), (True, False), (True, False)))
)
def test_moves_exactly_the_named_pages(dim, dst_ids, src_ids) -> None:
    shape = (3, 10, 4, 6) if dim else (10, 4, 6)
    src = torch.randint(0, 1 << 30, shape, dtype=torch.int64)
    dst = torch.zeros(shape, dtype=torch.int64)
    want = dst.clone()
    dst_pages, src_pages = [7, 2, 5], [1, 8, 4]
    dst_pages = dst_pages if dst_ids else [3, 4, 5]
    src_pages = src_pages if src_ids else [6, 7, 8]
    reference(want, dst_pages, src, src_pages, dim)
    dst_at = torch.tensor(dst_pages) if dst_ids else dst_pages[0]
    src_at = torch.tensor(src_pages) if src_ids else src_pages[0]
    move_pages_cpu(dst, dst_at, src, src_at, dim, 3)
    assert torch.equal(dst, want)
