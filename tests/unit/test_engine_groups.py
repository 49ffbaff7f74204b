"""The engine's own groups on one gloo rank: their collectives by their own methods, how the
engine's ranks meet in the store (a rank that never comes is named), the poll notes, and
that no group's threads outlive `close` (a gloo thread that frees a tensor while the
interpreter finalizes aborts the process)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import pipeline
from pipeline.engine.comms import Group
from pipeline.engine.groups import build, default_store, join
from pipeline.engine.poll_notes import PollNotes

pytestmark = pytest.mark.usefixtures("one_rank")


def native_threads() -> int:
    """This process's threads, the ones torch's and gloo's C++ starts included."""
    return len(os.listdir("/proc/self/task"))


def tp1(tmp_path: Path) -> pipeline.Job:
    store = ["storage=file", f"storage.path={tmp_path}"]
    return pipeline.compose(["model=tiny_mla", "topology=tp1", "topology.device=cpu", *store])


def test_a_made_group_runs_collectives_and_refuses_them_once_closed() -> None:
    group = build(default_store(), "test/made", (0,), "gloo", timeout_s=5)
    assert group.all_gather_object({"rank": 0}) == [{"rank": 0}]
    one = torch.ones(2)
    group.broadcast(one, 0)
    out = [torch.zeros(2)]
    group.all_gather(out, one)
    group.barrier()
    assert out[0].tolist() == [1.0, 1.0]
    group.close()
    with pytest.raises(RuntimeError, match=r"the engine's group of ranks \[0\] is closed"):
        group.barrier()


def test_the_callers_group_stays_usable_after_close() -> None:
    assert dist.group.WORLD is not None
    group = Group.theirs(dist.group.WORLD, timeout_s=8.0)
    group.close()
    dist.barrier()  # not shut down: only let go of


def test_a_rank_that_never_comes_is_named_and_the_call_taken_back() -> None:
    store = default_store()
    with pytest.raises(RuntimeError) as failed:
        join(store, (0, 1), timeout_s=0.2)
    said = str(failed.value)
    assert "create_engine on ranks [0, 1]: rank(s) 1 did not call it within" in said
    assert "create_engine is a collective over the group" in said
    assert "this rank, rank 0, is at its call #1 on these ranks; rank 1 has made 0" in said
    assert store.add("hicache-pipeline/0,1/calls/0", 0) == 0  # the next call is #1 again


def test_each_call_on_the_same_ranks_meets_under_its_own_prefix() -> None:
    store = default_store()
    assert [join(store, (0,), timeout_s=5) for _ in range(2)] == [
        "hicache-pipeline/0/1",
        "hicache-pipeline/0/2",
    ]


def test_a_collective_names_a_poll_its_rank_skipped() -> None:
    store = default_store()
    mine = PollNotes(store, "test/notes", 1, 2, timeout_s=8)
    peer = PollNotes(store, "test/notes", 0, 2, timeout_s=8)
    stuck = mine.stuck("a broadcast from rank 0")
    assert mine.skipped() is None  # the peer has noted nothing
    peer.in_poll(3, 1)(1.0)  # the peer has waited a while in poll #3
    mine.begun, mine.agreed = 2, 2
    stuck(3.9)  # before half the timeout: a peer may only be slow
    with pytest.raises(RuntimeError) as failed:
        stuck(4.0)
    assert str(failed.value).startswith(
        "poll: rank 0 waits in poll #3 with 1 acks outstanding, which this rank (rank 1) has "
        "not made: it has begun 2 polls, and all 2 ranks were last together at poll #2. "
        "poll() is a collective"
    )
    assert str(failed.value).endswith("(this rank waits in a broadcast from rank 0 instead)")
    mine.begun = 3  # this rank is in that poll too: the peer is not ahead of it
    assert mine.skipped() is None
    mine.begun = 2
    peer.done()
    assert mine.skipped() is None


def test_a_polls_timed_wait_leaves_its_group_usable() -> None:
    group = build(default_store(), "test/slow", (0,), "gloo", timeout_s=5)
    waited: list[float] = []
    out = [torch.zeros(1)]
    group.all_gather(out, torch.ones(1), waited.append)  # completes before a step ends
    assert (out[0].item(), waited) == (1.0, [])
    group.close()


def test_close_ends_every_thread_of_the_engines_groups(tmp_path: Path) -> None:
    job = tp1(tmp_path)
    pipeline.create_engine(job).close()  # what a first engine starts once per process
    before = native_threads()
    engine = pipeline.create_engine(job)
    assert native_threads() > before  # its gloo groups' threads
    engine.lookup(pipeline.page_keys(job, ["ab" * 16]))  # a collective on its cpu group
    engine.close()
    assert native_threads() == before  # joined now, not at the interpreter's exit


def test_a_runtime_never_closed_ends_its_groups_when_collected(tmp_path: Path) -> None:
    recipe = tp1(tmp_path).recipe()
    recipe.start_runtime(0).close()
    before = native_threads()
    runtime = recipe.start_runtime(0)
    for stream in runtime.streams:  # the runtime's own threads: only its groups are left
        stream.close()
    del runtime
    gc.collect()
    assert native_threads() == before  # and at exit, before the interpreter finalizes
