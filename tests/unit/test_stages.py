"""Each stage on its own, on CPU, in one process: real pools and plans, an inline stream, and
fake collectives that stand in for the replica group. Fast, and exact about bytes and ops."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.core.model import IndexerConfig, KvDtype, ModelGeometry, ModelKind, by_pool_kind
from pipeline.core.ownership import Ownership, owner_map
from pipeline.core.plan import Direction, PlanSpec, build_plan
from pipeline.core.slots import page_tokens
from pipeline.core.topology import POOL_LAYOUTS, IoBackend, MemLayout
from pipeline.engine.cuda.memcpy import copy_pages_cpu, upload_cpu
from pipeline.engine.cuda.memcpy_batch import cpu_stack_copier
from pipeline.engine.cuda.page_ids import PageIdBuffers
from pipeline.engine.cuda.page_kernel import move_pages_cpu
from pipeline.engine.cuda.streams import InlineStream
from pipeline.engine.transfer.batches import BatchRing
from pipeline.engine.transfer.pools import DevicePool, HostPool
from pipeline.engine.transfer.state import Resources, Trace, Transfer
from stages.broadcast import Broadcast
from stages.copy import Copy
from stages.gather import Gather
from stages.record_event import RecordEvent
from stages.scatter import Scatter
from stages.upload_page_ids import UploadPageIds
from stages.verify import Verify

PAGE, POOL_PAGES = 4, 12
MODEL = ModelGeometry(
    name="dsa",
    kind=ModelKind.mla,
    num_layers=3,
    kv_row_bytes=32,
    kv_dtype=KvDtype.bf16,
    page_size=PAGE,
    indexer=IndexerConfig(row_bytes=8, layers=[0, 2]),
)


class FakeCollectives:
    """One rank's view of a replica group whose broadcasts go through a shared mailbox: the
    source posts its bytes, every other rank takes a copy; all-gathers return `gathered`."""

    def __init__(self, rank: int, mailbox: list[torch.Tensor] | None = None) -> None:
        self.rank = rank
        self.mailbox = [] if mailbox is None else mailbox
        self.broadcasts: list[tuple[int, int]] = []
        """(source, bytes) per broadcast this rank took part in."""
        self.gathered: list[torch.Tensor] | None = None

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.broadcasts.append((src, tensor.numel()))
        if src == self.rank:
            self.mailbox.append(tensor.clone())
        else:
            tensor.copy_(self.mailbox.pop(0))

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> None:
        for i, o in enumerate(out):
            o.copy_(tensor if self.gathered is None else self.gathered[i])


def transfer(
    direction: Direction,
    host: list[int],
    device: list[int],
    *,
    ownership: Ownership = Ownership.replicated,
    rank: int = 0,
    io: IoBackend = IoBackend.kernel,
    layout: MemLayout = MemLayout.layer_first,
    chunk_pages: int = 0,
    staging_bytes: int = 1 << 20,
    load_group_bytes: int = 0,
    verify: bool = False,
    collectives: FakeCollectives | None = None,
) -> Transfer:
    """A transfer of this rank over real CPU pools (device pool filled at random)."""
    owners = owner_map(ownership, (0, 1), MODEL.units)
    owned = owners.owned(rank, MODEL.units)
    widest = max((sum(u.page_bytes for u in units) for units in by_pool_kind(owned)), default=0)
    spec = PlanSpec(
        rank=rank,
        units=MODEL.units,
        owners=owners,
        page_size=PAGE,
        dcp_size=1,
        host_slots=POOL_PAGES * PAGE,
        device_slots=POOL_PAGES * PAGE,
        io_backend=io,
        mem_layout=layout,
        staging_bytes=staging_bytes,
        chunk_pages=chunk_pages,
        load_group_bytes=load_group_bytes,
        batch_buffer_bytes=chunk_pages * widest,
    )
    plan = build_plan(
        direction, page_tokens(host, PAGE), page_tokens(device, PAGE), spec, verify=verify
    )
    device_pool = DevicePool.allocate(MODEL, POOL_PAGES, torch.device("cpu"))
    for buf in device_pool.buffers.values():
        buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape))
    host_pool = HostPool.allocate(MODEL, owned, POOL_PAGES, layout, pin_memory=False)
    for buf in host_pool.storage:
        buf.zero_()
    stream = InlineStream(timeout_s=5)
    res = Resources(
        device=torch.device("cpu"),
        device_pool=device_pool,
        host_pool=host_pool,
        host_view=host_pool,
        collectives=collectives or FakeCollectives(rank),
        copy_pages=copy_pages_cpu,
        copy_stacks=cpu_stack_copier(2),
        move_pages=move_pages_cpu,
        upload=upload_cpu,
        page_id_buffers=PageIdBuffers(torch.device("cpu"), POOL_PAGES),
        staging=torch.empty(staging_bytes, dtype=torch.uint8),
        batch_buffers=torch.empty((2, spec.batch_buffer_bytes), dtype=torch.uint8),
        gather_stream=stream,
        trace=Trace(keep_ops=True),
        timings_s={},
    )
    return Transfer(
        plan=plan,
        res=res,
        layer_events=plan.layout.layer_events(stream.new_event),
        done=stream.new_event(),
        all_copied=stream.new_event(),
        batches=BatchRing(res.batch_buffers, stream) if chunk_pages else None,
    )


def same_pages(t: Transfer, unit_ordinals: list[int], host: list[int], device: list[int]) -> bool:
    for o in unit_ordinals:
        unit = MODEL.units[o]
        h = t.res.host_pool.layer(unit).view(torch.uint8)[host]
        d = t.res.device_pool.layer(unit).view(torch.uint8)[device]
        if not torch.equal(h, d):
            return False
    return True


COPY_CASES = list(
    itertools.product(
        [IoBackend.kernel, IoBackend.direct], list(POOL_LAYOUTS), [0, 2], ["contiguous", "apart"]
    )
)


@pytest.mark.parametrize(("io", "layout", "chunk_pages", "placement"), COPY_CASES)
def test_copy_backs_up_every_owned_unit_and_nothing_else(io, layout, chunk_pages, placement):
    host, device = ([2, 3, 4], [5, 6, 7]) if placement == "contiguous" else ([9, 0, 4], [1, 8, 3])
    t = transfer(Direction.backup, host, device, io=io, layout=layout, chunk_pages=chunk_pages)
    stream = InlineStream(timeout_s=5)
    for step in t.plan.steps:
        Copy().on_step(t, step, stream)
    assert same_pages(t, list(range(len(MODEL.units))), host, device)
    untouched = [p for p in range(POOL_PAGES) if p not in host]
    assert all(not b[untouched].any() for b in t.res.host_pool.views.values())
    copies = [o for o in t.res.trace.ops if o["op"] == "copy"]
    assert sum(o["bytes"] for o in copies) == 3 * MODEL.bytes_per_token * PAGE
    gathers = [o for o in t.res.trace.ops if o["op"] == "batch_gather"]
    # only a page_first_direct host takes gathered batches; a kernel moves one in one launch
    one_call = io is IoBackend.direct and layout is MemLayout.page_first_direct
    # 3 pages in batches of 2 and 1, one step per pool kind, each a batch of several units
    assert len(gathers) == (4 if chunk_pages and one_call else 0)
    assert [g["buffer"] for g in gathers] == [0, 1, 0, 1][: len(gathers)]


GROUPS = {0: 3, 600: 2, 1 << 30: 1}
"""load_group_bytes -> the groups of 3 pages of MODEL's 3 layers (480, 384 and 480 B): each
layer on its own, layers 0-1 then layer 2, all three in one group."""


@pytest.mark.parametrize(
    ("io", "layout", "group_bytes", "placement"),
    list(itertools.product(IoBackend, POOL_LAYOUTS, GROUPS, ["apart", "host_run"])),
)
def test_copy_loads_host_pages_into_device_pages(io, layout, group_bytes, placement) -> None:
    host, device = ([7, 1, 2], [0, 10, 11]) if placement == "apart" else ([4, 5, 6], [9, 0, 3])
    t = transfer(Direction.load, host, device, io=io, layout=layout, load_group_bytes=group_bytes)
    for buf in t.res.host_pool.storage:
        buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape))
    for step in t.plan.steps:
        Copy().on_step(t, step, InlineStream(timeout_s=5))
    assert same_pages(t, list(range(len(MODEL.units))), host, device)
    assert [o["direction"] for o in t.res.trace.ops] == ["h2d"] * len(t.res.trace.ops)


def test_copy_moves_only_the_units_a_rotating_rank_owns() -> None:
    t = transfer(Direction.backup, [0, 1], [2, 3], ownership=Ownership.rotating, rank=1)
    for step in t.plan.steps:
        Copy().on_step(t, step, InlineStream(timeout_s=5))
    owned = [u.ordinal for u in t.plan.spec.owners.owned(1, MODEL.units)]
    assert owned == [1, 3]  # kv layer 1 and the first index-K unit (ordinal 3 % 2 == 1)
    assert same_pages(t, owned, [0, 1], [2, 3])
    assert sorted(o["unit"] for o in t.res.trace.ops) == owned


def exchange_through(ranks: list[Transfer]) -> None:
    """Run gather -> broadcast -> scatter step by step on every rank, the source first (as the
    real group would complete each broadcast)."""
    stages = (Gather(), Broadcast(), Scatter())
    for i, step in enumerate(ranks[0].plan.steps):
        if not ranks[0].plan.exchanged(step.unit):
            continue
        src = ranks[0].plan.source(step.unit)
        for t in sorted(ranks, key=lambda t: t.plan.spec.rank != src):
            for stage in stages:
                stage.on_step(t, t.plan.steps[i], InlineStream(timeout_s=5))


@pytest.mark.parametrize("ownership", [Ownership.rotating, Ownership.single_source])
@pytest.mark.parametrize("pages_apart", [False, True])
def test_gather_broadcast_scatter_give_every_rank_the_owners_bytes(ownership, pages_apart):
    """Staging slices of 2 pages; with pages apart on the device, each exchanged step goes
    through staging (gather on the owner, scatter on the peer), else in place."""
    device = [[0, 5, 9], [11, 3, 4]] if pages_apart else [[0, 1, 2], [6, 7, 8]]
    mailbox: list[torch.Tensor] = []
    ranks = [
        transfer(
            Direction.load,
            [0, 1, 2],
            device[r],
            ownership=ownership,
            rank=r,
            staging_bytes=2 * PAGE * 32,
            collectives=FakeCollectives(r, mailbox),
        )
        for r in (0, 1)
    ]
    exchange_through(ranks)
    for unit in MODEL.units:
        src = ranks[0].plan.source(unit)
        got = [
            t.res.device_pool.layer(unit).view(torch.uint8)[device[r]] for r, t in enumerate(ranks)
        ]
        assert torch.equal(got[0], got[1]), unit  # the peer now holds the owner's bytes
        assert torch.equal(got[src], got[1 - src])
    ops = [[o["op"] for o in t.res.trace.ops] for t in ranks]
    staged = {"gather", "scatter"} & set(ops[0] + ops[1])
    assert staged == ({"gather", "scatter"} if pages_apart else set())
    assert not mailbox  # every broadcast was received


def test_replicated_loads_exchange_nothing() -> None:
    t = transfer(Direction.load, [0, 1], [2, 3])
    exchange_through([t])
    assert t.res.collectives.broadcasts == [] and t.res.trace.ops == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("group_bytes", list(GROUPS))
def test_record_event_marks_each_layer_after_its_last_step_and_the_ack_at_the_end(
    group_bytes,
) -> None:
    """Each layer's event completes after the last step of its layer, or of its group of
    layers (load_group_bytes): no layer is usable before all of its units are copied."""
    t = transfer(Direction.load, [0, 1, 2], [3, 4, 5], load_group_bytes=group_bytes)
    record, copied = RecordEvent(), set()
    for step in t.plan.steps:
        record.on_step(t, step, InlineStream(timeout_s=5))
        copied |= {u.ordinal for u in step.units}
        for unit in MODEL.units:
            if t.layer_events[unit.layer].query():
                assert unit.ordinal in copied, f"layer {unit.layer} usable before its copy"
    assert set(t.layer_events) == set(range(MODEL.num_layers))
    assert all(e.query() for e in t.layer_events.values()) and not t.done.query()
    assert len({id(e) for e in t.layer_events.values()}) == GROUPS[group_bytes]  # one a group
    record.on_transfer(t, InlineStream(timeout_s=5))
    assert t.done.query()


def test_upload_page_ids_moves_ids_for_kernels_only() -> None:
    kernel = transfer(Direction.load, [3, 1], [0, 7])
    UploadPageIds().on_transfer(kernel, InlineStream(timeout_s=5))
    assert kernel.host_ids is not None and kernel.host_ids.tolist() == [3, 1]
    assert kernel.device_ids is not None and kernel.device_ids.tolist() == [0, 7]
    direct = transfer(Direction.load, [3, 1], [0, 7], io=IoBackend.direct)
    UploadPageIds().on_transfer(direct, InlineStream(timeout_s=5))
    assert direct.host_ids is None  # direct copies take page numbers from the plan's runs


def test_verify_passes_equal_digests_and_names_the_first_difference() -> None:
    t = transfer(Direction.load, [0, 1, 2], [4, 5, 6], verify=True)
    Verify().on_transfer(t, InlineStream(timeout_s=5))  # the fake group echoes this rank's digests
    fake = t.res.collectives
    assert isinstance(fake, FakeCollectives)
    assert [o["op"] for o in t.res.trace.ops] == ["verify"]
    theirs = torch.zeros(len(MODEL.units), 3, dtype=torch.int64)
    fake.gathered = [theirs.clone(), theirs.clone()]
    fake.gathered[1][2, 1] = 1  # rank 1 differs at unit 2 (kv layer 2), transfer page 1
    with pytest.raises(
        RuntimeError,
        match="rank 1 loaded different bytes than rank 0 at kv "
        "layer 2, transfer page 1 \\(host page 1\\)",
    ):
        Verify().on_transfer(t, InlineStream(timeout_s=5))


def test_verify_runs_only_on_loads_the_plan_marks() -> None:
    t = transfer(Direction.load, [0, 1], [4, 5], verify=False)
    Verify().on_transfer(t, InlineStream(timeout_s=5))
    assert t.res.trace.ops == []
