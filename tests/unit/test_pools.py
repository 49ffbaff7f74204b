"""Host pools (layouts, views, capacity), device pools, the page allocator and page_tokens."""

from __future__ import annotations

import random

import pytest
import torch

from pipeline.core.model import IndexerConfig, KvDtype, ModelGeometry, ModelKind
from pipeline.core.ownership import Ownership, owner_map
from pipeline.core.sizing import host_capacity
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.core.topology import POOL_LAYOUTS, MemLayout
from pipeline.engine.cuda.stacks import stack_views
from pipeline.engine.transfer.pools import DevicePool, HostPool

MODEL = ModelGeometry(
    name="m", kind=ModelKind.mla, num_layers=4, kv_row_bytes=64, kv_dtype=KvDtype.bf16, page_size=4
)
LAYER_BYTES = 4 * 64  # one page of one layer
DSA = ModelGeometry(
    name="d",
    kind=ModelKind.mla,
    num_layers=3,
    kv_row_bytes=48,
    kv_dtype=KvDtype.fp8,
    page_size=4,
    indexer=IndexerConfig(row_bytes=16, layers=[0, 2]),
)
LAYOUTS = list(POOL_LAYOUTS)


def host(model=MODEL, owned=None, pages=6, layout=MemLayout.layer_first) -> HostPool:
    owned = model.units if owned is None else owned
    return HostPool.allocate(model, owned, pages, layout, pin_memory=False)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_views_are_page_wise(layout: MemLayout) -> None:
    """Every unit's view is [pages, rows_per_page, row_elems] in its pool's dtype."""
    pool = host(DSA, layout=layout)
    kv, index = DSA.units[0], DSA.units[3]
    assert pool.layer(kv).shape == (6, 4, 48) and pool.layer(kv).dtype == torch.uint8
    assert pool.layer(index).shape == (6, 1, 64)
    assert host(layout=layout).layer(MODEL.units[2]).shape == (6, 4, 32)
    assert host(layout=layout).layer(MODEL.units[2]).dtype == torch.bfloat16


@pytest.mark.parametrize("layout", LAYOUTS)
def test_views_alias_distinct_memory(layout: MemLayout) -> None:
    """Writing one unit's view changes that unit only, and lands in the pool's storage."""
    pool = host(layout=layout)
    for buf in pool.storage:
        buf.zero_()
    for i, unit in enumerate(MODEL.units):
        pool.layer(unit).fill_(i + 1)
    for i, unit in enumerate(MODEL.units):
        assert bool((pool.layer(unit) == i + 1).all())
    assert sorted(pool.storage[0].unique().tolist()) == [1, 2, 3, 4]
    assert int((pool.storage[0] == 3).sum()) == 6 * 4 * 32


@pytest.mark.parametrize("layout", LAYOUTS)
def test_storage_shape_per_layout(layout: MemLayout) -> None:
    """Storage puts the unit axis first, third, or second."""
    shape = {
        MemLayout.layer_first: (4, 6, 4, 32),
        MemLayout.page_first: (6, 4, 4, 32),
        MemLayout.page_first_direct: (6, 4, 4, 32),
    }[layout]
    assert tuple(host(layout=layout).storage[0].shape) == shape


def test_page_first_direct_keeps_a_page_of_a_layer_contiguous() -> None:
    """In page_first_direct one page of one unit is a contiguous block; in page_first not."""
    unit = MODEL.units[1]
    assert host(layout=MemLayout.page_first_direct).layer(unit)[2].is_contiguous()
    assert not host(layout=MemLayout.page_first).layer(unit)[2].is_contiguous()
    assert host(layout=MemLayout.layer_first).layer(unit).is_contiguous()


def test_a_dsa_pool_keeps_kv_and_index_units_in_separate_buffers() -> None:
    units = DSA.units
    pool = host(DSA, owned=(units[0], units[1], units[3]), layout=MemLayout.page_first)
    assert len(pool.storage) == 2


def test_nbytes_and_unowned_units() -> None:
    """nbytes sums the owned units only; asking for an unowned unit names it."""
    pool = host(owned=MODEL.units[1::2], pages=5)
    assert pool.nbytes == 2 * 5 * LAYER_BYTES
    with pytest.raises(ValueError, match=r"unit 0 \(kv layer 0\) is not held by this rank"):
        pool.layer(MODEL.units[0])
    assert host(DSA, pages=2).nbytes == 2 * (3 * 4 * 48 + 2 * 64)


def test_device_pool_holds_every_unit() -> None:
    """A device pool has a view per unit, page-wise (one buffer per pool kind)."""
    pool = DevicePool.allocate(DSA, 3, torch.device("cpu"))
    assert [tuple(pool.layer(u).shape) for u in DSA.units] == [(3, 4, 48)] * 3 + [(3, 1, 64)] * 2
    assert pool.nbytes == 3 * (3 * 4 * 48 + 2 * 64)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stacked_units_are_one_view_over_the_pool(layout: MemLayout) -> None:
    """A rotating rank's units (every other kv layer) stack on both pools: a batch copy through
    the stacks writes exactly those units' pages."""
    owners = owner_map(Ownership.rotating, (0, 1), MODEL.units)
    mine = owners.owned(1, MODEL.units)  # kv layers 1 and 3
    device = DevicePool.allocate(MODEL, 5, torch.device("cpu"))
    pool = host(owned=mine, layout=layout)
    for o, words in device.words.items():
        words.copy_(torch.arange(words.numel()).view(words.shape) + 1000 * o)
    for words in pool.words.values():
        words.zero_()
    dev, hst = device.stacked(mine), pool.stacked(mine)
    assert dev is not None and hst is not None
    assert dev.shape[:2] == (2, 5) and hst.shape[:2] == (2, 6)
    hst.index_copy_(1, torch.tensor([4, 0]), dev.index_select(1, torch.tensor([2, 3])))
    for u in mine:
        host_words, dev_words = pool.words[u.ordinal], device.words[u.ordinal]
        assert torch.equal(host_words[4], dev_words[2]) and torch.equal(host_words[0], dev_words[3])
        assert not host_words[1:4].any() and not host_words[5].any()


def test_units_of_two_pool_kinds_or_uneven_spacing_do_not_stack() -> None:
    device = DevicePool.allocate(DSA, 3, torch.device("cpu"))
    kv = [u for u in DSA.units if u.pool == "kv"]
    index = [u for u in DSA.units if u.pool == "index"]
    assert device.stacked(tuple(kv)) is not None and device.stacked(tuple(index)) is not None
    assert device.stacked((kv[0], index[0])) is None  # two buffers
    assert device.stacked((kv[0], kv[1], kv[0])) is None  # not evenly spaced upward
    assert stack_views([device.words[kv[1].ordinal], device.words[kv[0].ordinal]]) is None


# --- host capacity ---------------------------------------------------------------------------

BUDGET = 4 * LAYER_BYTES * 100  # 100 pages of the unsharded pool


def capacity(ownership: Ownership, group: tuple[int, ...], rank: int, keep: bool):
    owners = owner_map(ownership, group, MODEL.units)
    return host_capacity(MODEL, owners, rank, BUDGET, keep_capacity=keep)


@pytest.mark.parametrize("keep", [False, True])
def test_replicated_capacity(keep: bool) -> None:
    """Replicated: 100 pages in the whole budget, whatever keep_capacity says."""
    cap = capacity(Ownership.replicated, (0, 1), 1, keep)
    assert (cap.num_pages, cap.pool_bytes) == (100, BUDGET)


@pytest.mark.parametrize("size", [2, 4])
def test_rotating_multiplies_capacity(size: int) -> None:
    """Rotating without keep_capacity: group-size x the pages in the same bytes."""
    for rank in range(size):
        cap = capacity(Ownership.rotating, tuple(range(size)), rank, keep=False)
        assert (cap.num_pages, cap.pool_bytes) == (100 * size, BUDGET)


@pytest.mark.parametrize("size", [2, 4])
def test_rotating_keep_capacity_shrinks_pool(size: int) -> None:
    """Rotating with keep_capacity: the same 100 pages in 1/group-size of the bytes."""
    for rank in range(size):
        cap = capacity(Ownership.rotating, tuple(range(size)), rank, keep=True)
        assert (cap.num_pages, cap.pool_bytes) == (100, BUDGET // size)


def test_single_source_peers_hold_nothing() -> None:
    """single_source: the first rank holds the whole pool, its peers 0 bytes, same page count."""
    first = capacity(Ownership.single_source, (2, 3), 2, keep=False)
    peer = capacity(Ownership.single_source, (2, 3), 3, keep=False)
    assert (first.num_pages, first.pool_bytes) == (100, BUDGET)
    assert (peer.num_pages, peer.pool_bytes) == (100, 0)


def test_uneven_rotation_sizes_for_the_widest_rank() -> None:
    """5 layers over 2 ranks: pages are sized for the rank owning 3 layers, on both ranks."""
    model = ModelGeometry(
        name="m5",
        kind=ModelKind.mla,
        num_layers=5,
        kv_row_bytes=64,
        kv_dtype=KvDtype.bf16,
        page_size=4,
    )
    owners = owner_map(Ownership.rotating, (0, 1), model.units)
    caps = [host_capacity(model, owners, r, 3 * LAYER_BYTES * 10, False) for r in (0, 1)]
    assert [(c.num_pages, c.pool_bytes) for c in caps] == [
        (10, 10 * 3 * LAYER_BYTES),
        (10, 10 * 2 * LAYER_BYTES),
    ]


# --- page allocator --------------------------------------------------------------------------


def test_allocator_hands_out_first_free_pages() -> None:
    """Without an rng, the lowest free pages, and freed pages are reused first."""
    a = PageAllocator(8)
    assert a.alloc(3) == [0, 1, 2]
    assert a.alloc(2) == [3, 4]
    a.free([1, 3])
    assert a.alloc(3) == [1, 3, 5]
    assert (a.num_free, a.free_pages()) == (2, [6, 7])


def test_allocator_seeded_sample_is_deterministic() -> None:
    """The same seed gives the same distinct pages on every allocator."""
    got = [PageAllocator(64).alloc(10, random.Random(7)) for _ in range(2)]
    assert got[0] == got[1]
    assert len(set(got[0])) == 10 and all(0 <= p < 64 for p in got[0])
    assert got[0] != list(range(10))  # not the first-free answer
    assert PageAllocator(64).alloc(10, random.Random(8)) != got[0]


def test_allocator_out_of_pages() -> None:
    """Asking for more than is free names both counts and the total."""
    a = PageAllocator(4)
    a.alloc(3)
    with pytest.raises(ValueError, match=r"out of pages: asked for 2, 1 free of 4"):
        a.alloc(2)
    assert a.num_free == 1


def test_allocator_double_free_and_foreign_pages() -> None:
    """Freeing a free page, or one outside the pool, is an error that changes nothing."""
    a = PageAllocator(4)
    a.alloc(2)
    a.free([0])
    with pytest.raises(ValueError, match=r"pages \[0\] are not allocated"):
        a.free([0])
    with pytest.raises(ValueError, match=r"pages \[9\] are not allocated"):
        a.free([1, 9])
    assert a.free_pages() == [0, 2, 3]


def test_page_tokens() -> None:
    """Whole pages become their token slots, in page order, as CPU int64."""
    slots = page_tokens([2, 0], 4)
    assert slots.tolist() == [8, 9, 10, 11, 0, 1, 2, 3]
    assert slots.dtype == torch.int64 and slots.device.type == "cpu"
