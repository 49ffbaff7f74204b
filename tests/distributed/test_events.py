"""KV events on real gloo ranks, read by a real ZeroMQ subscriber (pyzmq) in the test's
process: a scripted round (backup, host eviction, write-back, store eviction, load from L3)
under each strategy; every batch decoded, what a slow subscriber missed asked of the replay
socket, a late subscriber replaying from a sequence number, and each tier's residency rebuilt
from the events equal to what the ranks' tiers hold. One stream per replica group where the
group holds one copy (single_source, rotating), one per rank under replicated; none at all
with events=none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import eventfns
import pytest
from conftest import job_config

from pipeline.config.job import Job
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

OBJECTS_HELD = 6
"""The bounded store holds this many objects: the second prefix's write-back evicts."""


def events_job(strategy: str, store: Path, ports: tuple[int, int]) -> Job:
    return job_config(
        f"strategy={strategy}",
        "model=tiny_dsa",
        "topology=tp2",
        "storage=file",
        f"storage.path={store}",
        f"storage.capacity_bytes={OBJECTS_HELD * 1374}",  # tiny_dsa objects: up to 1374 B
        f"workload.num_tokens={eventfns.PAGES * 4}",
        "events=zmq",
        f"events.endpoint=tcp://127.0.0.1:{ports[0]}",
        f"events.replay_endpoint=tcp://127.0.0.1:{ports[1]}",
    )


@pytest.mark.parametrize(
    ("strategy", "kind"),
    [
        ("replicated", "file"),
        ("single_source", "file"),
        ("rotating", "file"),
        pytest.param("rotating", "mooncake", marks=pytest.mark.mooncake, id="rotating-mooncake"),
    ],
)
def test_a_subscriber_rebuilds_every_tier_from_the_events(
    strategy: str, kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store, flags = tmp_path / "store", tmp_path / "flags"
    store.mkdir()
    flags.mkdir()
    ports = (eventfns.free_ports(2), eventfns.free_ports(2))
    job = events_job(strategy, store, ports)
    medium = "DISK"
    if kind == "mooncake":  # unbounded: its master evicts on its own, and tells no client
        job = dataclasses.replace(job, storage=request.getfixturevalue("mooncake"))
        medium = "EXTERNAL"
    streams = [
        eventfns.Stream(f"tcp://127.0.0.1:{ports[0] + i}", f"tcp://127.0.0.1:{ports[1] + i}")
        for i in range(2)
    ]
    subscriber = eventfns.Subscriber(streams)
    publishers = 2 if strategy == "replicated" else 1
    found: dict = {}

    def replays() -> None:  # while the ranks wait, their publishers still open
        for rank in range(2):
            eventfns.wait_for(flags / f"done-{rank}")
        for i, stream in enumerate(streams[:publishers]):
            whole = subscriber.replay(stream, 0)
            late = subscriber.replay(stream, len(whole) // 2)
            found[i] = (whole, late)
        (flags / "replayed").touch()

    held = eventfns.launched_beside(eventfns.scripted, (job, str(flags)), 2, replays, subscriber)
    assert held is not None and held[0] == held[1]  # the group's tiers hold the same pages
    assert (held[0]["evicted"] > 0) == (kind == "file")  # the bounded folder evicted
    for i in range(publishers):
        whole, late = found[i]
        assert sorted(whole) == list(range(len(whole)))  # every sequence number, kept
        assert all(whole[s] == batch for s, batch in streams[i].live.items())
        assert late == {s: b for s, b in whole.items() if s >= len(whole) // 2}
        assert type(whole[0].events[0]).__name__ == "AllBlocksCleared"
        assert {b.dp_rank for b in whole.values()} == {0} and streams[i].topics <= {b""}
        tiers = eventfns.residency(whole)
        assert tiers.get("CPU_PINNED", set()) == set(held[i]["host"])
        # the store's events: the group's first rank's (it writes and evicts)
        assert tiers.get(medium, set()) == (set(held[i]["l3"]) if i == 0 else set())
        first = next(
            e for b in whole.values() for e in b.events if type(e).__name__ == "BlockStored"
        )
        assert (first.medium, first.token_ids) == ("CPU_PINNED", held[i]["tokens"])
        assert first.block_size == held[i]["page_tokens"]
    assert all(not stream.live for stream in streams[publishers:])  # one stream per group


def test_events_none_opens_no_socket_and_no_thread(tmp_path: Path) -> None:
    job = job_config("model=tiny_dsa", "topology=tp2", "storage=file", f"storage.path={tmp_path}")
    assert job.events.kind.value == "none"  # the default
    ranks = launch(eventfns.quiet, job, 2, backend="gloo", timeout_s=120)
    nothing = {"events": None, "freed_hook": None, "listeners": 0, "threads": []}
    assert ranks == [nothing, nothing]
