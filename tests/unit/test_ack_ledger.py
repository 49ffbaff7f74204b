"""AckLedger on a one-rank gloo group: order, consensus count, skip bookkeeping, poll timer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from pipeline.engine.acks import AckLedger, digest_of
from pipeline.engine.comms import Group
from pipeline.engine.cuda.streams import CpuEvent


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    assert dist.group.WORLD is not None
    yield Group.theirs(dist.group.WORLD, timeout_s=8.0)
    dist.destroy_process_group()


def ledger(group: Group, **knobs) -> AckLedger:
    options = {
        "skip_enabled": False,
        "max_skips": 3,
        "storage_attached": False,
        "debug_consensus": True,
        "poll_timer_every": 0,
        **knobs,
    }
    return AckLedger(group, **options)


def fired() -> CpuEvent:
    event = CpuEvent(timeout_s=5)
    event.set()
    return event


def test_only_leading_completed_acks_pop_in_order(group: Group) -> None:
    acks = ledger(group)
    first, second, third = (
        acks.submit("backup", e) for e in (fired(), CpuEvent(timeout_s=5), fired())
    )
    assert [a.seq for a in acks.poll(lambda: 0)] == [first.seq]
    assert list(acks.pending) == [second, third]  # the third waits behind the second
    second.event.set()  # type: ignore[attr-defined]
    assert [a.seq for a in acks.poll(lambda: 0)] == [second.seq, third.seq]


def test_idle_polls_skip_until_a_sync_is_forced(group: Group) -> None:
    acks = ledger(group, skip_enabled=True, max_skips=3)
    for _ in range(8):
        acks.poll(lambda: 42)
    # skip, skip, skip, forced sync, skip x3, forced sync
    assert (acks.stats.skipped, acks.stats.reduces, acks.stats.forced) == (6, 2, 2)
    assert list(acks.stats.decisions)[:4] == [(True, 0), (True, 0), (True, 0), (False, 0)]


def test_outstanding_acks_or_storage_disable_the_skip(group: Group) -> None:
    busy = ledger(group, skip_enabled=True)
    busy.submit("load", CpuEvent(timeout_s=5))
    busy.poll(lambda: 0)
    stored = ledger(group, skip_enabled=True, storage_attached=True)
    stored.poll(lambda: 0)
    assert busy.stats.skipped == stored.stats.skipped == 0


def test_poll_timer_logs_every_n_polls(group: Group, caplog) -> None:
    acks = ledger(group, poll_timer_every=2)
    with caplog.at_level(logging.INFO, logger="hicache-pipeline"):
        for _ in range(4):
            acks.poll(lambda: 0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poll: mean")]
    assert len(lines) == 2 and "over 4 polls (4 reduces, 0 skipped)" in lines[1]


def test_digest_is_stable_and_sensitive() -> None:
    assert digest_of([1, 2], [(0, "load")]) == digest_of([1, 2], [(0, "load")])
    assert digest_of([1, 2], []) != digest_of([1, 3], [])
