"""The engine's host slots on one rank: `alloc`, `free` and `reuse` in token slots, and the
mistakes a scheduler can make, each refused naming the argument before any state changes."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

import pipeline
from pipeline.core.slots import page_tokens

if TYPE_CHECKING:
    from pipeline.engine.host_slots import HostSlots


@pytest.fixture
def engine(one_rank: None) -> Iterator[pipeline.Engine]:
    job = pipeline.compose(["model=tiny_mla", "topology=tp1", "topology.device=cpu"])
    made = pipeline.create_engine(job)
    try:
        yield made
    finally:
        made.close()


def test_alloc_hands_out_the_lowest_free_pages_as_token_slots(engine: pipeline.Engine) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    total = slots.num_free
    first, second = slots.alloc(2 * size), slots.alloc(size)
    assert first.tolist() == list(range(2 * size))
    assert second.tolist() == list(range(2 * size, 3 * size))
    assert first.dtype == torch.int64 and slots.num_free == total - 3 * size
    slots.free(first)
    assert slots.alloc(size).tolist() == list(range(size))  # freed slots come back


def test_a_backed_up_slot_freed_holds_no_data(engine: pipeline.Engine) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    host = slots.alloc(size)
    engine.backup(host, page_tokens([0], size)).wait()
    engine.load(host, page_tokens([1], size)).done().wait()
    slots.free(host)
    with pytest.raises(
        ValueError, match=r"host_indices names host pages that are not alloc.*\[0\]"
    ):
        engine.load(host, page_tokens([1], size))


def test_reuse_drops_the_data_and_keeps_the_slots(engine: pipeline.Engine) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    host = slots.alloc(size)
    engine.backup(host, page_tokens([0], size)).wait()
    free = slots.num_free
    slots.reuse(host)
    assert slots.num_free == free  # still allocated
    with pytest.raises(ValueError, match="host_indices name pages that hold no data"):
        engine.load(host, page_tokens([1], size))
    slots.free(host)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s, n: [s.free(h) for h in [s.alloc(n)] * 2], "host pages that are not allocated"),
        (lambda s, n: s.free(page_tokens([s.num_slots // n], n)), r"host_slots has slots outside"),
        (
            lambda s, n: s.reuse(page_tokens([3], n)),
            r"host_slots names host pages that are not allocated .*\[3\]",
        ),
        (lambda s, n: s.free(torch.arange(1, n + 1)), "host_slots is not page-aligned"),
        (lambda s, n: s.free(torch.arange(n).int()), "host_slots must be a CPU int64 tensor"),
        (lambda s, n: s.alloc(n - 1), r"num_slots=3 must be a positive multiple of 4"),
        (lambda s, n: s.alloc(0), r"num_slots=0 must be a positive multiple"),
        (lambda s, n: s.alloc(2.0), r"num_slots must be an int \(got float\)"),
        (lambda s, n: s.alloc(s.num_slots + n), r"num_slots=\d+: only \d+ of \d+ host slots"),
    ],
)
def test_mistakes_are_refused_naming_the_argument(
    engine: pipeline.Engine, call: Callable[[HostSlots, int], object], message: str
) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    held = slots.alloc(size)  # page 0 stays allocated through every mistake
    free = slots.num_free
    with pytest.raises(ValueError, match=message):
        call(slots, size)
    assert slots.num_free == free
    slots.free(held)


def test_the_example_scheduler_manages_host_slots_through_public_calls_only() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "scheduler.py"
    names = {
        node.attr
        for node in ast.walk(ast.parse(example.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "engine"
    }
    assert "host_slots" in names
    assert not {"host_allocator", "resources", "spec"} & names
    assert not [n for n in names if n.startswith("_")]
