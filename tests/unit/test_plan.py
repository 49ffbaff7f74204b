"""build_plan: input validation, runs, steps (backup chunks, load slices), pieces and bytes."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from pipeline.core.model import IndexerConfig, KvDtype, ModelGeometry, ModelKind
from pipeline.core.ownership import Ownership, owner_map
from pipeline.core.plan import Direction, PlanSpec, Run, StepsCache, TransferPlan, build_plan
from pipeline.core.slots import page_tokens
from pipeline.core.topology import POOL_LAYOUTS, IoBackend, MemLayout
from pipeline.jobs.plan_report import copy_calls

PAGE = 4
MODEL = ModelGeometry(
    name="m",
    kind=ModelKind.mla,
    num_layers=4,
    kv_row_bytes=64,
    kv_dtype=KvDtype.bf16,
    page_size=PAGE,
)
PAGE_BYTES = PAGE * 64  # of one KV unit
DSA = ModelGeometry(
    name="d",
    kind=ModelKind.mla,
    num_layers=2,
    kv_row_bytes=48,
    kv_dtype=KvDtype.fp8,
    page_size=PAGE,
    indexer=IndexerConfig(row_bytes=16, layers=[1]),
)


def plan(
    host,
    device=None,
    *,
    direction=Direction.backup,
    ownership=Ownership.replicated,
    group=(0, 1),
    rank=0,
    model=MODEL,
    dcp_size=1,
    staging_bytes=1 << 20,
    io_backend=IoBackend.kernel,
    layout=MemLayout.layer_first,
    chunk_pages=0,
    batch_buffer_bytes=1 << 20,
    load_group_bytes=0,
    known_steps=None,
    breaks=frozenset(),
) -> TransferPlan:
    """A plan over pages (lists of page ids become whole-page slot tensors)."""

    def slots(x):
        return page_tokens(x, PAGE * dcp_size) if isinstance(x, list) else x

    host = slots(host)
    device = host.clone() if device is None else slots(device)
    spec = PlanSpec(
        rank=rank,
        units=model.units,
        owners=owner_map(ownership, group, model.units),
        page_size=PAGE,
        dcp_size=dcp_size,
        host_slots=64 * dcp_size,
        device_slots=64 * dcp_size,
        io_backend=io_backend,
        mem_layout=layout,
        staging_bytes=staging_bytes,
        chunk_pages=chunk_pages,
        load_group_bytes=load_group_bytes,
        batch_buffer_bytes=batch_buffer_bytes if chunk_pages else 0,
    )
    return build_plan(direction, host, device, spec, known_steps=known_steps, breaks=breaks)


# --- validation ------------------------------------------------------------------------------


def t(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


@pytest.mark.parametrize(
    ("host", "device", "match"),
    [
        (t(0, 1, 2, 3, 4, 5), None, r"host_indices has 6 slots: transfers move whole pages of 4"),
        (t(), None, r"host_indices has 0 slots"),
        (t(60, 61, 62, 63, 64, 65, 66, 67), None, r"host_indices has slots outside 0\.\.63"),
        (t(0, 1, 2, 3), t(-4, -3, -2, -1), r"device_indices has slots outside 0\.\.63"),
        ([0, 1], [0], r"host_indices has 8 slots and device_indices 4: pass one device slot"),
        ([3, 1, 3], None, r"host_indices names a page twice"),
        ([0], [2, 2], r"device_indices names a page twice"),
        (t(1, 2, 3, 4), None, r"host_indices is not page-aligned.*start at a multiple of 4"),
        (t(0, 1, 3, 2), None, r"host_indices is not page-aligned"),
        (t(4, 5, 6, 7, 8, 10, 9, 11), None, r"host_indices is not page-aligned"),
        (torch.arange(4, dtype=torch.int32), None, r"host_indices must be a CPU int64 tensor"),
        # near 2**63 the old `start + page` check wrapped around and let a page through
        (t(*range(2**63 - 4, 2**63)), None, r"host_indices has slots outside"),
        (t(0, 1, 2, 3), t(*range(2**63 - 8, 2**63 - 4)), r"device_indices has slots outside"),
        (torch.arange(8).view(2, 4), None, r"host_indices must be a 1-D tensor"),
        ([0, 1, 2, 3], None, None),
    ],
)
def test_bad_indices_raise(host, device, match) -> None:
    """Every malformed input is a ValueError naming the argument and the rule."""
    if match is None:  # a well-formed control case
        assert plan(host, device).num_pages == 4
        return
    with pytest.raises(ValueError, match=match):
        plan(host, device)


def test_non_tensor_input_rejected() -> None:
    """A Python sequence is not a tensor of slots."""
    with pytest.raises(ValueError, match="host_indices must be a 1-D tensor of slot indices"):
        plan((0, 1, 2, 3), t(0, 1, 2, 3))


DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_non_cpu_indices_rejected(device: str) -> None:
    """Plans are computed on the host: any non-CPU tensor (meta stands in for CUDA) is refused."""
    with pytest.raises(ValueError, match=rf"device_indices must be a CPU int64 tensor.*{device}"):
        plan([0], torch.arange(4, device=device))


def test_dcp_widens_pages() -> None:
    """With dcp 2 a page is 8 logical slots: 4 slots are ragged, 8 make one page."""
    with pytest.raises(ValueError, match=r"whole pages of 8 slots \(page_size x dcp_size\)"):
        plan(t(0, 1, 2, 3), dcp_size=2)
    p = plan([5, 2], dcp_size=2)
    assert p.host_pages.tolist() == [5, 2]
    assert (p.num_pages, p.num_tokens) == (2, 16)


# --- runs ------------------------------------------------------------------------------------


def test_contiguous_pages_are_one_run() -> None:
    """Consecutive on both sides: a single run."""
    assert plan([2, 3, 4], [5, 6, 7]).runs == (Run(0, 2, 5, 3),)


def test_fragmented_pages_split_runs() -> None:
    """A break on either side starts a new run."""
    assert plan([0, 1, 5], [3, 4, 5]).runs == (Run(0, 0, 3, 2), Run(2, 5, 5, 1))
    assert plan([0, 1, 2], [0, 2, 3]).runs == (Run(0, 0, 0, 1), Run(1, 1, 2, 2))
    assert len(plan([9, 7, 5, 3]).runs) == 4


def test_runs_in_clips_to_a_page_window() -> None:
    """runs_in shifts host/device pages with the clipped start."""
    p = plan([0, 1, 2, 8, 9], [10, 11, 12, 14, 15])
    assert p.runs_in(1, 3) == (Run(1, 1, 11, 2), Run(3, 8, 14, 1))
    assert p.runs_in(4, 5) == (Run(4, 9, 15, 1),)
    assert p.runs_in(0, 0) == ()


# --- backup steps ----------------------------------------------------------------------------


def test_an_unchunked_backup_is_one_step_of_every_copied_unit_over_every_page() -> None:
    """Unchunked backup: the owned units of a pool kind in one step, over all pages (one
    copy call or kernel may then move them all)."""
    p = plan([0, 1, 2], ownership=Ownership.rotating, rank=1)
    assert [([u.ordinal for u in s.units], s.first, s.count) for s in p.steps] == [([1, 3], 0, 3)]


def test_chunked_covers_every_page_in_order_per_unit() -> None:
    """chunk_pages=2 over 5 pages: batches of 2, 2, 1, each one step over every copied unit."""
    steps = plan([0, 1, 2, 3, 4], chunk_pages=2).steps
    assert [(s.first, s.count) for s in steps] == [(0, 2), (2, 2), (4, 1)]
    assert all(s.units == MODEL.units and s.unit == MODEL.units[0] for s in steps)
    for unit in MODEL.units:
        pages = [k for s in steps if unit in s.units for k in range(s.first, s.first + s.count)]
        assert pages == [0, 1, 2, 3, 4]
    assert all(s.last_in_layer for s in steps)
    unchunked = plan([0, 1, 2, 3, 4], chunk_pages=0).steps
    assert [(s.units, s.first, s.count) for s in unchunked] == [(MODEL.units, 0, 5)]


def test_chunked_batches_one_step_per_pool_kind_of_the_units_a_rank_copies() -> None:
    """Replicated DSA: per batch, the kv units in one step and the index unit in another;
    rotating rank 0 copies kv unit 0 and index unit 2 (ordinal % 2), one step each."""
    kinds = [([0, 1], 0, 2), ([2], 0, 2), ([0, 1], 2, 1), ([2], 2, 1)]
    got = [
        ([u.ordinal for u in s.units], s.first, s.count)
        for s in plan([0, 1, 2], model=DSA, chunk_pages=2).steps
    ]
    assert got == kinds
    rotating = plan([0, 1, 2], ownership=Ownership.rotating, rank=0, model=DSA, chunk_pages=2)
    assert [[u.ordinal for u in s.units] for s in rotating.steps] == [[0], [2], [0], [2]]


def test_chunked_steps_move_at_most_staging_bytes() -> None:
    """4 kv units x 2 pages of PAGE_BYTES: a budget of 5 pages makes steps of 2 units; one
    smaller than a unit's pages still copies each unit (one per step)."""
    p = plan([0, 1, 2, 3], chunk_pages=2, staging_bytes=5 * PAGE_BYTES)
    assert [[u.ordinal for u in s.units] for s in p.steps] == [[0, 1], [2, 3]] * 2
    assert [len(s.units) for s in plan([0, 1, 2, 3], chunk_pages=2, staging_bytes=1).steps] == [
        1
    ] * 8


def test_the_plan_marks_the_batches_that_go_through_a_batch_buffer() -> None:
    """A chunked step of several units that fits the batch buffer, where the host takes a
    gathered batch in one DMA per run (direct with page_first_direct); nothing when
    unchunked, nothing for the kernel backend (one launch moves a batch from the device
    pages to the host)."""
    direct = {"io_backend": IoBackend.direct, "layout": MemLayout.page_first_direct}
    assert all(s.gathered for s in plan([0, 1, 2], chunk_pages=2, **direct).steps)
    assert not any(s.gathered for s in plan([0, 1, 2], chunk_pages=0, **direct).steps)
    small = plan([0, 1, 2], chunk_pages=2, batch_buffer_bytes=2 * 4 * PAGE_BYTES - 1, **direct)
    assert [s.gathered for s in small.steps] == [False, True]  # 2 pages do not fit, 1 does
    for layout in POOL_LAYOUTS:
        assert not any(s.gathered for s in plan([0, 1, 2], chunk_pages=2, layout=layout).steps)
    layer_first = {"io_backend": IoBackend.direct, "chunk_pages": 2}
    assert not any(s.gathered for s in plan([0, 1, 2], **layer_first).steps)
    rotating = plan([0, 1, 2], ownership=Ownership.rotating, model=DSA, chunk_pages=2, **direct)
    assert not any(s.gathered for s in rotating.steps)  # one unit per kind: nothing to gather


def test_copy_calls_are_one_per_clipped_run_or_one_per_kernel_step() -> None:
    """Direct copies: per run of pages one call for every stacked unit (per unit where the
    pools do not stack them); kernel: one."""
    p = plan([0, 1, 2, 6], [4, 5, 6, 7], io_backend=IoBackend.direct)
    step = p.steps[0]
    assert p.runs_in(step.first, step.count) == (Run(0, 0, 4, 3), Run(3, 6, 7, 1))
    assert copy_calls(p, step) == 2
    unstacked = dataclasses.replace(p, spec=dataclasses.replace(p.spec, pools_stack=False))
    assert copy_calls(unstacked, step) == 2 * len(step.units)
    kernel = plan([0, 1, 2, 6], [4, 5, 6, 7])
    assert copy_calls(kernel, kernel.steps[0]) == 1
    # a page_first_direct host spaces a unit's pages apart: each run still one call for
    # every unit (a batch of copies)
    layout = MemLayout.page_first_direct
    direct = {"io_backend": IoBackend.direct, "layout": layout, "batch_buffer_bytes": 0}
    chunked = plan([0, 1, 2, 6], [4, 5, 6, 7], **direct, chunk_pages=4)
    (chunk,) = chunked.steps
    assert copy_calls(chunked, chunk) == 2
    chunked_kernel = plan([0, 1, 2, 6], [4, 5, 6, 7], chunk_pages=4)
    assert copy_calls(chunked_kernel, chunked_kernel.steps[0]) == 1


# --- bytes -----------------------------------------------------------------------------------

FULL = 4 * 4 * PAGE_BYTES  # 4 layers x 4 pages


def moved(direction, ownership, rank, group=(0, 1)) -> tuple[int, int, int]:
    """(bytes copied between tiers, broadcast bytes sent, received) for 4 pages."""
    p = plan([0, 1, 2, 3], direction=direction, ownership=ownership, group=group, rank=rank)
    key = "d2h_bytes" if direction is Direction.backup else "h2d_bytes"
    got = p.bytes_moved()
    assert list(got) == [key, "broadcast_send_bytes", "broadcast_recv_bytes"]
    return tuple(got.values())


def test_bytes_moved_replicated() -> None:
    """Every rank copies all 4 layers of 4 pages; nothing is broadcast."""
    assert moved(Direction.backup, Ownership.replicated, 1) == (FULL, 0, 0)
    assert moved(Direction.load, Ownership.replicated, 1) == (FULL, 0, 0)


def test_bytes_moved_rotating() -> None:
    """Each rank copies and sends its share and receives the rest (backup: no broadcast)."""
    half = FULL // 2
    for rank in (0, 1):
        assert moved(Direction.backup, Ownership.rotating, rank) == (half, 0, 0)
        assert moved(Direction.load, Ownership.rotating, rank) == (half, half, half)
    quarter = FULL // 4
    group = (4, 5, 6, 7)
    assert moved(Direction.load, Ownership.rotating, 6, group) == (quarter, quarter, 3 * quarter)


def test_bytes_moved_single_source() -> None:
    """The first rank copies and sends everything; its peer only receives."""
    assert moved(Direction.load, Ownership.single_source, 0) == (FULL, FULL, 0)
    assert moved(Direction.load, Ownership.single_source, 1) == (0, 0, FULL)
    assert moved(Direction.backup, Ownership.single_source, 0) == (FULL, 0, 0)
    assert moved(Direction.backup, Ownership.single_source, 1) == (0, 0, 0)


# --- load steps ------------------------------------------------------------------------------


def test_load_steps_slice_exchanged_units_by_staging_bytes() -> None:
    """2 pages fit the staging buffer: each layer is 2 steps, only the second ends the layer."""
    p = plan(
        [0, 1, 2, 3],
        direction=Direction.load,
        ownership=Ownership.rotating,
        staging_bytes=2 * PAGE_BYTES + 1,
    )
    assert [(s.unit.ordinal, s.first, s.count, s.last_in_layer) for s in p.steps] == [
        (u, f, 2, f == 2) for u in range(4) for f in (0, 2)
    ]


def test_load_steps_at_least_one_page_per_slice() -> None:
    """A staging buffer smaller than a page still moves one page per step."""
    p = plan([0, 1, 2], direction=Direction.load, ownership=Ownership.rotating, staging_bytes=1)
    assert [(s.first, s.count) for s in p.steps if s.unit.ordinal == 0] == [(0, 1), (1, 1), (2, 1)]
    assert sum(s.last_in_layer for s in p.steps) == 4


def test_load_steps_unsliced_when_not_exchanged() -> None:
    """Replicated loads ignore staging_bytes: one whole-transfer step per layer."""
    p = plan([0, 1, 2, 3], direction=Direction.load, staging_bytes=1)
    assert [(s.unit.ordinal, s.count, s.last_in_layer) for s in p.steps] == [
        (u, 4, True) for u in range(4)
    ]


def test_load_steps_group_kv_and_index_by_layer() -> None:
    """A DSA layer's KV and index-K units form one layer; only its very last step ends it.

    Staging holds 2 KV pages (2 x 192 B) but all 4 index-K pages (64 B each)."""
    p = plan(
        [0, 1, 2, 3],
        direction=Direction.load,
        ownership=Ownership.rotating,
        model=DSA,
        staging_bytes=2 * PAGE * 48,
    )
    assert [(s.unit.ordinal, s.unit.layer, s.first, s.count, s.last_in_layer) for s in p.steps] == [
        (0, 0, 0, 2, False),
        (0, 0, 2, 2, True),
        (1, 1, 0, 2, False),
        (1, 1, 2, 2, False),
        (2, 1, 0, 4, True),
    ]


def test_known_steps_are_laid_out_once_per_direction_and_page_count() -> None:
    cache = StepsCache(capacity=2)
    load = dict(direction=Direction.load, ownership=Ownership.rotating, known_steps=cache)
    first = plan([0, 1, 2], [5, 6, 7], **load)
    again = plan([9, 3, 4], [1, 2, 8], **load)
    assert again.steps is first.steps  # other pages, same count: the same steps
    assert (
        first.steps
        == plan([0, 1, 2], [5, 6, 7], direction=Direction.load, ownership=Ownership.rotating).steps
    )
    assert plan([0, 1], **load).steps is not first.steps
    assert plan([0, 1, 2], known_steps=cache).steps is not first.steps  # a backup lays its own
    # the oldest of 3 shapes was evicted at capacity 2: laid out anew
    assert plan([9, 3, 4], [1, 2, 8], **load).steps is not first.steps


@pytest.mark.parametrize(
    ("group_bytes", "groups"),
    [(0, [[0], [1]]), (1, [[0], [1]]), (1 << 30, [[0, 1]])],
)
def test_a_load_groups_consecutive_unexchanged_layers_until_a_group_moves_enough(
    group_bytes, groups
) -> None:
    """load_group_bytes over 4 pages of DSA (kv on layers 0 and 1, index on layer 1): one
    step per pool kind per group, the last completing the group's layers."""
    p = plan([0, 1, 2, 3], model=DSA, direction=Direction.load, load_group_bytes=group_bytes)
    completed = [list(s.layers) for s in p.steps if s.last_in_layer]
    assert completed == groups
    assert p.layout.layers == (0, 1)
    for step in p.steps:
        assert len({u.pool for u in step.units}) == 1 and (step.first, step.count) == (0, 4)
    events = p.layout.layer_events(object)
    assert [[layer for layer in events if events[layer] is events[g[0]]] for g in groups] == groups


@pytest.mark.parametrize("group_bytes", [0, 1 << 30])
@pytest.mark.parametrize("breaks", [(), (1,), (1, 3), (1, 2, 3)])
def test_a_load_s_groups_of_layers_break_where_asked(group_bytes, breaks) -> None:
    """`breaks` (a streamed load's groups of reads) start a group of steps whatever
    load_group_bytes says, so no step waits for two groups of reads; the cache keeps a layout
    per set of breaks."""
    cache = StepsCache()
    load = {"direction": Direction.load, "load_group_bytes": group_bytes, "known_steps": cache}
    p = plan([0, 1, 2, 3], **load, breaks=frozenset(breaks))
    completed = [list(s.layers) for s in p.steps if s.last_in_layer]
    if group_bytes:  # one group but where broken
        bounds = [0, *breaks, 4]
        assert completed == [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    else:  # every layer on its own already
        assert completed == [[0], [1], [2], [3]]
    assert plan([4, 5, 6, 7], **load, breaks=frozenset(breaks)).steps is p.steps
    unbroken = plan([0, 1, 2, 3], **load).steps
    assert (unbroken is p.steps) == (not breaks)


def test_a_load_never_groups_the_layers_a_rank_broadcasts() -> None:
    """rotating over a group of two: every layer is exchanged, so each goes on its own (its
    copy, then its broadcast, per layer), whatever load_group_bytes says."""
    grouped = {"ownership": Ownership.rotating, "load_group_bytes": 1 << 30}
    p = plan([0, 1], direction=Direction.load, **grouped)
    assert [s.layers for s in p.steps if s.last_in_layer] == [(u.layer,) for u in MODEL.units]
