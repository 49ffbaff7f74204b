"""The batch copier on cuda: a run of every stacked unit between a page_first_direct host and
the device, as one batch call and as its copies one by one, byte for byte what the CPU copier
moves, for runs longer and shorter than the units and both directions."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.engine.cuda.cudart import cuda_runtime
from pipeline.engine.cuda.memcpy import stack_pages
from pipeline.engine.cuda.memcpy_batch import (
    batch_call,
    cpu_stack_copier,
    cuda_stack_copier,
    one_by_one,
)
from pipeline.engine.transfer.pools import uva_alias

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
UNITS, PAGES, WIDTH = 6, 20, 96  # bytes of a page of one unit


def stacks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pinned host [pages, units, width], its UVA alias stacked [units, pages, width], a
    device pool [units, pages, width]), each filled with its own random bytes."""
    host = torch.randint(0, 256, (PAGES, UNITS, WIDTH), dtype=torch.uint8).pin_memory()
    pool = torch.randint(0, 256, (UNITS, PAGES, WIDTH), dtype=torch.uint8, device=device)
    return host, uva_alias(host, device).transpose(0, 1), pool


@pytest.mark.parametrize(
    ("how", "load", "count"),
    list(itertools.product(["batch", "one_by_one"], [False, True], [1, 3, UNITS, 11])),
)
def test_a_run_of_every_unit_lands_where_the_cpu_copier_puts_it(how, load, count, caplog) -> None:
    device = torch.device("cuda", 0)
    lib = cuda_runtime(device)
    assert lib is not None
    copy = cuda_stack_copier(lib, 0, (batch_call if how == "batch" else one_by_one)(lib))
    host, host_stack, pool = stacks(device)
    want_host, want_pool = host.transpose(0, 1).clone(), pool.cpu()
    host_page, device_page = 7, 2  # the run's first page on each side
    if load:
        copy(stack_pages(pool), device_page, stack_pages(host_stack), host_page, count)
        cpu_stack_copier(2)(
            stack_pages(want_pool), device_page, stack_pages(want_host), host_page, count
        )
    else:
        copy(stack_pages(host_stack), host_page, stack_pages(pool), device_page, count)
        cpu_stack_copier(2)(
            stack_pages(want_host), host_page, stack_pages(want_pool), device_page, count
        )
    torch.cuda.synchronize()
    assert torch.equal(host.transpose(0, 1), want_host)  # nothing else on the host moved
    assert torch.equal(pool.cpu(), want_pool)
    assert "copying one by one" not in caplog.text  # the runtime took the batch call
