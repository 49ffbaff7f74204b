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
from unittest import mock

import numpy as np
import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import pipeline
import stages.copy as copy_stage
from pipeline.core.model import by_pool_kind
from pipeline.core.plan import Direction
from pipeline.core.slots import page_tokens
from pipeline.core.steps import backup_steps
from pipeline.engine.cuda.streams import InlineStream
from pipeline.engine.transfer import executor

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


PLACEMENTS = {
    "contiguous": ([0, 1, 2, 3], [8, 9, 10, 11]),
    "scattered": ([0, 2, 4, 6], [8, 10, 12, 14]),
    "host_run": ([0, 1, 2, 3], [14, 8, 12, 10]),  # the bench's fragmented placement
}
"""(host pages, device pages) of the 4-page transfer per placement."""


def engine_with(overrides: list[str], host_pages: list[int], device_pages: list[int]):
    """A one-rank CPU engine of tiny_mla, the slots of these pages, the host's holding data."""
    job = pipeline.compose(["model=tiny_mla", "topology=tp1", "workload.num_tokens=64", *overrides])
    engine = pipeline.create_engine(job)
    size = engine.sizing.slots_per_page
    host, device = page_tokens(host_pages, size), page_tokens(device_pages, size)
    engine.host_allocator.claim(host_pages)
    engine.host_allocator.hold_data(np.array(host_pages), held=True)
    return engine, host, device


def ours(code) -> bool:
    """The project's own code."""
    return "/pipeline/" in code.co_filename or "/stages/" in code.co_filename


def issued(
    layers: int,
    io: list[str],
    chunk: int,
    direction: Direction,
    placement: str,
    group_bytes: int = 0,
    library: Counter[str] | None = None,
):
    """(project Python calls, torch ops by name, copy calls) of one transfer of 4 pages (a
    load: each layer on its own, or with `group_bytes` its layers in groups); `library` gets
    the library functions it calls (`library_calls`)."""
    overrides = [
        f"model.num_layers={layers}",
        f"strategy.chunk_pages={chunk}",
        f"strategy.load_group_bytes={group_bytes}",
        *io,
    ]
    engine, host, device = engine_with(overrides, *PLACEMENTS[placement])
    stream = InlineStream(30.0)
    pipe = engine.strategy.backup if direction is Direction.backup else engine.strategy.load

    def once() -> None:
        t = engine.transfer(direction, host, device, stream, None)
        executor.issue_transfer(pipe, t, stream, stream, None)

    once()  # what is made once per engine or transfer shape is not the issue path's
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        calls += event == "call" and ours(frame.f_code)

    copies = engine.trace.counts.get("copy", 0)
    with Ops() as ops:
        sys.setprofile(count)
        once()
        sys.setprofile(None)
    copies = engine.trace.counts.get("copy", 0) - copies
    if library is not None:  # apart: the torch ops' counter is library code too
        library.update(library_calls(once))
    engine.close()
    return calls, ops.names, copies


# (io, chunk_pages, direction, placement): budgets per layer of (Python calls, torch ops,
# copy calls), as the paths issue them today. A load makes each layer usable in turn: per
# layer its copy call or kernels and a layer event (on CPU a Python event, hence more calls).
# A direct copy call is one `copy_` on CPU (one cudaMemcpy2DAsync and no torch op on cuda;
# for a run of several stacked units, one cudaMemcpy3DBatchAsync);
# a kernel step is one `move_pages` call (one kernel launch and no torch op on cuda; on CPU
# torch's gather and scatter), one kernel where the host pages are one run, or
# where its pages are consecutive on both sides the direct backend's one copy call. A backup
# has no layer to make usable: its steps cover every unit of a pool kind, so nothing it
# issues grows with the layers (one call or kernel moves them all where the pools stack).
BUDGETS = {
    ("direct", 0, "load", "contiguous"): (12, 1, 1),
    ("kernel", 0, "load", "contiguous"): (14, 1, 1),
    ("kernel", 0, "load", "scattered"): (15, 2, 1),
    ("kernel", 0, "load", "host_run"): (15, 1, 1),
    # a load is never chunked, and a fragmented direct one makes one copy call per run (4)
    ("direct", 2, "load", "scattered"): (15, 4, 4),
    ("kernel", 2, "load", "scattered"): (15, 2, 1),
    **{
        (io, chunk, "backup", placement): (1, 0, 0)
        for io, chunk, placement in [
            ("direct", 0, "contiguous"),
            ("direct", 2, "contiguous"),
            ("direct", 2, "scattered"),
            *[("kernel", c, p) for c in (0, 2) for p in PLACEMENTS],
        ]
    },
}


WHAT = ("Python calls", "torch ops", "copy calls")


@pytest.mark.parametrize("case", list(BUDGETS), ids=lambda c: "-".join(map(str, c)))
def test_each_path_issues_no_more_per_layer_than_its_budget(case) -> None:
    io, chunk, direction, placement = case
    args = (DIRECT if io == "direct" else KERNEL, chunk, Direction(direction), placement)
    (calls, ops, copies), (more_calls, more_ops, more_copies) = issued(4, *args), issued(12, *args)
    torch_ops = sum(more_ops.values()) - sum(ops.values())
    per_layer = ((more_calls - calls) / 8, torch_ops / 8, (more_copies - copies) / 8)
    budget = BUDGETS[case]
    for what, got, most in zip(WHAT, per_layer, budget, strict=True):
        assert got <= most, f"{case}: {got:g} {what} per layer (budget {most})"


@pytest.mark.parametrize("direction", [Direction.backup, Direction.load])
def test_a_kernel_step_is_one_copy_call_where_its_pages_are_consecutive(direction) -> None:
    """What the bench's kernel rows compare: consecutive pages on both sides go as the direct
    backend's copy call (a `copy_` on CPU: per layer in a load, one for all the stacked units
    of a backup), scattered ones as a gather and a scatter, and device pages scattered behind
    one run of host pages (the bench's fragmented rows) as one kernel."""
    load = direction is Direction.load
    moves = ("aten.copy_", "aten.index_select", "aten.index_copy_")
    _, consecutive, _ = issued(4, KERNEL, 0, direction, "contiguous")
    _, scattered, _ = issued(4, KERNEL, 0, direction, "scattered")
    _, host_run, _ = issued(4, KERNEL, 0, direction, "host_run")
    per = 4 if load else 1  # per layer of the 4, or once
    assert [consecutive[op] for op in moves] == [per, 0, 0]
    assert [scattered[op] for op in moves] == [0, per, per]
    assert [host_run[op] for op in moves] == ([0, 0, 4] if load else [0, 1, 0])


@pytest.mark.parametrize(
    ("io", "placement"),
    [("direct", "contiguous"), *[("kernel", p) for p in PLACEMENTS]],
)
def test_a_grouped_load_issues_one_call_per_group_not_per_layer(io, placement) -> None:
    """strategy.load_group_bytes: the layers of a group go in one copy call or kernel pair
    and one event; with every layer in one group nothing that moves bytes grows with them."""
    args = (DIRECT if io == "direct" else KERNEL, 0, Direction.load, placement)
    (_, few_ops, few_copies), (_, many_ops, many_copies) = (
        issued(n, *args, group_bytes=1 << 30) for n in (4, 12)
    )
    moves = ("aten.copy_", "aten.index_select", "aten.index_copy_")
    assert [few_ops[op] for op in moves] == [many_ops[op] for op in moves]
    assert few_copies == many_copies == 1


@pytest.mark.parametrize("batch_bytes", [1 << 30, 1])
def test_a_chunked_backups_steps_share_their_units_tuple_across_chunks(batch_bytes) -> None:
    """The issue path derives a batch's views once per backup, keyed by the identity of the
    step's units: every chunk's step of one batch of units holds the same tuple."""
    engine = pipeline.create_engine(
        pipeline.compose(["model=tiny_mla", "model.num_layers=6", "topology=tp1"])
    )
    copied = engine.spec.units
    engine.close()
    steps = backup_steps(
        copied,
        10,
        chunk_pages=3,
        batch_bytes=batch_bytes,
        buffer_bytes=1 << 30,
        one_call_batches=True,
    )
    by_units: dict[tuple[int, ...], set[int]] = {}
    for step in steps:
        by_units.setdefault(tuple(u.ordinal for u in step.units), set()).add(id(step.units))
    assert all(len(ids) == 1 for ids in by_units.values())
    assert len(by_units) == (len(by_pool_kind(copied)) if batch_bytes > 1 else len(copied))


BATCH_BUDGETS = {
    ("direct", "contiguous"): (29, 1, 1),
    ("kernel", "contiguous"): (10, 1, 1),
    ("kernel", "host_run"): (8, 1, 1),
}
"""Per chunked backup batch: (Python calls, torch ops, copy calls), as issued today (31, 18
and 15 at d61fd63, before the copy stage kept a step's calls and read each batch's buffer
and bytes once). direct (page_first_direct): its gather (one `move_pages` call: a launch on
cuda, a torch op on CPU), one DMA per run, two events and the gather stream's switch, each a
handful of calls. kernel: the step's one `move_pages` (a torch op on CPU), or one strided
DMA where the pages are consecutive. Nothing per page or per unit."""


@pytest.mark.parametrize(("io", "placement"), list(BATCH_BUDGETS))
def test_a_chunked_backup_issues_no_more_per_batch_than_its_budget(io, placement) -> None:
    config = DIRECT if io == "direct" else KERNEL
    (calls, ops, copies), (more_calls, more_ops, more_copies) = (
        issued(12, config, chunk, Direction.backup, placement)
        for chunk in (2, 1)  # 2 batches, then 4
    )
    torch_ops = sum(more_ops.values()) - sum(ops.values())
    per_batch = ((more_calls - calls) / 2, torch_ops / 2, (more_copies - copies) / 2)
    for what, got, most in zip(WHAT, per_batch, BATCH_BUDGETS[io, placement], strict=True):
        assert got <= most, f"{io} {placement}: {got:g} {what} per batch (budget {most})"


PLAN_CALLS = {Direction.backup: 18, Direction.load: 20}
"""Distinct library functions one plan (`Engine.transfer`) calls from the project's code on
CPU, as today (21 / 26 at 6e36c20; a backup's 15 became 18 when it checked, as a load does,
that its host pages are the caller's): numpy's and torch's, C or Python, and the events' (on
CPU a threading.Event's; on cuda the runtime's). Once the host has run anything else for a
few milliseconds, each distinct call costs tens of microseconds whatever its size
(docs/benchmarks/history/2026-12-02-to-04-sessions-12-23.md, session 22), so a plan pays
for each kind of call it makes, not for its pages."""


def library_call(frame, event: str, arg) -> str | None:
    """The library function (C or Python, numpy's, torch's, the runtime's) the project's
    own code calls at this profiler event, if any; what the library then calls is its own
    (numpy's operators run in their type's slots, which the profiler does not see)."""
    if event == "c_call" and generated_or_ours(frame.f_code) and arg is not sys.setprofile:
        return arg.__qualname__
    caller = frame.f_back
    if event == "call" and not generated_or_ours(frame.f_code) and caller:
        return frame.f_code.co_qualname if generated_or_ours(caller.f_code) else None
    return None


def generated_or_ours(code) -> bool:
    """The project's code, with what it generates (a dataclass's __init__)."""
    return ours(code) or code.co_filename.startswith("<")


def plan_calls(direction: Direction, pages: int) -> Counter[str]:
    """The library functions one plan of `pages` scattered pages calls, and how often."""
    scattered = list(range(0, 2 * pages, 2)), list(range(8, 8 + pages))
    engine, host, device = engine_with([], *scattered)
    stream = InlineStream(30.0)
    engine.transfer(direction, host, device, stream, None)  # layouts made once per shape
    called = library_calls(lambda: engine.transfer(direction, host, device, stream, None))
    engine.close()
    return called


def library_calls(block) -> Counter[str]:
    """The library functions `block` calls from the project's code, and how often."""
    called: Counter[str] = Counter()

    def count(frame, event, arg) -> None:
        if callee := library_call(frame, event, arg):
            called[callee] += 1

    sys.setprofile(count)
    try:
        block()
    finally:
        sys.setprofile(None)
    return called


@pytest.mark.parametrize("direction", [Direction.backup, Direction.load])
def test_a_plan_makes_the_same_few_library_calls_whatever_its_pages(direction) -> None:
    few, many = plan_calls(direction, 4), plan_calls(direction, 16)
    assert few == many, f"the calls grow with the pages: {sorted((many - few).elements())}"
    assert len(many) <= PLAN_CALLS[direction], f"{len(many)} distinct calls: {sorted(many)}"


ISSUE_CALLS = {
    ("direct", "backup"): 30,
    ("direct", "load"): 31,
    ("kernel", "backup"): 27,
    ("kernel", "load"): 28,
}
"""Distinct library functions one whole transfer (plan and issue, 4 scattered pages) calls
from the project's code on CPU, as today (38, 40, 35, 36 at 6e36c20; see `PLAN_CALLS`):
what a small request pays before its bytes, the same kinds whatever its layers."""


@pytest.mark.parametrize("case", list(ISSUE_CALLS), ids="-".join)
def test_a_transfer_makes_the_same_few_kinds_of_library_call_whatever_its_layers(case) -> None:
    io, direction = case
    config, at_4, at_12 = DIRECT if io == "direct" else KERNEL, Counter[str](), Counter[str]()
    issued(4, config, 0, Direction(direction), "scattered", library=at_4)
    issued(12, config, 0, Direction(direction), "scattered", library=at_12)
    assert set(at_4) == set(at_12), f"more kinds with more layers: {sorted(at_12 - at_4)}"
    assert len(at_12) <= ISSUE_CALLS[case], f"{len(at_12)} kinds: {sorted(at_12)}"


@pytest.mark.parametrize(("io", "chunk"), [("direct", 0), ("kernel", 0), ("kernel", 2)])
@pytest.mark.parametrize("direction", [Direction.backup, Direction.load])
def test_a_transfer_of_a_known_shape_finds_its_copy_calls_without_working_them_out(
    io, chunk, direction
) -> None:
    """How a step of several units is copied is found once per units tuple, which the
    engine's layouts share across transfers of one shape (a load's groups, a backup's pool
    kinds and chunks; a chunked direct backup's batches keep their own views): the next such
    transfer looks it up."""
    overrides = [*(DIRECT if io == "direct" else KERNEL), f"strategy.chunk_pages={chunk}"]
    engine, host, device = engine_with(overrides, *PLACEMENTS["scattered"])
    stream = InlineStream(30.0)
    pipe = engine.strategy.backup if direction is Direction.backup else engine.strategy.load
    found = []
    route = copy_stage._route

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        found.append(args[1])
        return route(*args, **kwargs)

    with mock.patch.object(copy_stage, "_route", counted):
        for _ in range(2):
            t = engine.transfer(direction, host, device, stream, None)
            executor.issue_transfer(pipe, t, stream, stream, None)
            made, found[:] = len(found), []
    engine.close()
    assert made == 0  # the second transfer: every route known
    assert any(engine.resources.copy_routes.values())  # the first made some (several units)
