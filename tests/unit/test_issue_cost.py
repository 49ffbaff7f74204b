"""What a transfer costs the host to issue, per layer, on every path (issue time, BENCHMARKS.md).

Issuing is host time the scheduler's thread does not schedule, paid on every layer of every
transfer (61 for DeepSeek-V3): each Python call there costs about half a microsecond, each
torch op about ten and each copy call about seven on the H200's host. These budgets pin what
each path issues per layer, counted, not timed: the project's own Python calls, the torch ops
and the copy calls. A change that makes the issue path do more per layer fails here, on CPU.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import pipeline
from pipeline.engine import executor
from pipeline.engine.streams import InlineStream
from pipeline.spec.plan import Direction
from pipeline.spec.slots import page_tokens

DIRECT = ["topology.io_backend=direct", "topology.mem_layout=page_first_direct"]
KERNEL = ["topology.io_backend=kernel", "topology.mem_layout=layer_first"]


pytestmark = pytest.mark.usefixtures("one_rank")


VIEWS = {"aten.slice", "aten.narrow", "aten.select", "aten.view", "aten.alias"}
"""Ops that make a view: no kernel, no copy (they still cost the host, as Python calls do)."""


class Ops(TorchDispatchMode):
    """The torch ops a block issues that move bytes, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.names[name] += name not in VIEWS
        return func(*args, **(kwargs or {}))


def issued(layers: int, io: list[str], chunk: int, direction: Direction, fragmented: bool):
    """(project Python calls, torch ops by name, copy calls) of one transfer of 4 pages."""
    job = pipeline.compose(
        [
            "model=tiny_mla",
            f"model.num_layers={layers}",
            "topology=tp1",
            "workload.num_tokens=64",
            f"strategy.chunk_pages={chunk}",
            *io,
        ]
    )
    engine = pipeline.create_engine(job)
    size = engine.sizing.slots_per_page
    pages = [0, 2, 4, 6] if fragmented else [0, 1, 2, 3]
    host, device = page_tokens(pages, size), page_tokens([p + 8 for p in pages], size)
    engine.host_allocator.hold_data(np.array(pages), held=True)
    stream = InlineStream(30.0)
    pipe = engine.strategy.backup if direction is Direction.backup else engine.strategy.load

    def once() -> None:
        t = engine.transfer(direction, host, device, stream, None)
        executor.issue_transfer(pipe, t, stream, stream, None)

    once()  # what is made once per engine or transfer shape is not the issue path's
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        name = frame.f_code.co_filename
        calls += event == "call" and ("/pipeline/" in name or "/stages/" in name)

    copies = engine.trace.counts.get("copy", 0)
    with Ops() as ops:
        sys.setprofile(count)
        once()
        sys.setprofile(None)
    copies = engine.trace.counts.get("copy", 0) - copies
    engine.close()
    return calls, ops.names, copies


# (io, chunk_pages, direction, fragmented): budgets per layer of (Python calls, torch ops,
# copy calls), as the paths issue them today. Loads record a layer event (on CPU a Python
# event, hence more calls). A direct copy call is one `copy_` on CPU (one cudaMemcpy2DAsync
# and no torch op on cuda); a kernel step is a gather and a scatter, or where its pages are
# consecutive on both sides the direct backend's one copy call.
BUDGETS = {
    ("direct", 0, "backup", False): (7, 1, 1),
    ("direct", 0, "load", False): (13, 1, 1),
    ("kernel", 0, "backup", False): (10, 1, 1),
    ("kernel", 0, "backup", True): (10, 2, 1),
    ("kernel", 0, "load", False): (16, 1, 1),
    ("kernel", 0, "load", True): (16, 2, 1),
    # chunked: a backup batch moves every unit at once (nothing per layer but its share of
    # the batch's bookkeeping); a load is never chunked, and a fragmented direct one makes
    # one copy call per run (4 here)
    ("direct", 2, "backup", False): (12, 0, 0),
    ("direct", 2, "backup", True): (16, 0, 0),
    ("direct", 2, "load", True): (22, 4, 4),
    ("kernel", 2, "backup", False): (12, 0, 0),
    ("kernel", 2, "backup", True): (12, 0, 0),
    ("kernel", 2, "load", True): (16, 2, 1),
}


WHAT = ("Python calls", "torch ops", "copy calls")


@pytest.mark.parametrize("case", list(BUDGETS), ids=lambda c: "-".join(map(str, c)))
def test_each_path_issues_no_more_per_layer_than_its_budget(case) -> None:
    io, chunk, direction, fragmented = case
    args = (DIRECT if io == "direct" else KERNEL, chunk, Direction(direction), fragmented)
    (calls, ops, copies), (more_calls, more_ops, more_copies) = issued(4, *args), issued(12, *args)
    torch_ops = sum(more_ops.values()) - sum(ops.values())
    per_layer = ((more_calls - calls) / 8, torch_ops / 8, (more_copies - copies) / 8)
    budget = BUDGETS[case]
    for what, got, most in zip(WHAT, per_layer, budget, strict=True):
        assert got <= most, f"{case}: {got:g} {what} per layer (budget {most})"


@pytest.mark.parametrize("direction", [Direction.backup, Direction.load])
def test_a_kernel_step_is_one_copy_call_where_its_pages_are_consecutive(direction) -> None:
    """What the bench's kernel rows compare: consecutive pages on both sides go as the direct
    backend's copy call (a `copy_` on CPU), scattered ones as a gather and a scatter."""
    _, consecutive, _ = issued(4, KERNEL, 0, direction, False)
    _, scattered, _ = issued(4, KERNEL, 0, direction, True)
    moves = ("aten.copy_", "aten.index_select", "aten.index_copy_")
    assert [consecutive[op] for op in moves] == [4, 0, 0]  # one per layer of the 4
    assert [scattered[op] for op in moves] == [0, 4, 4]
