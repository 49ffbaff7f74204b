"""KV events on one CPU rank: what a reused or freed host page says, read back through the
real publisher's replay socket, and a backup's keys checked before any byte moves."""

from __future__ import annotations

from pathlib import Path

import eventfns
import msgspec
import pytest
import torch
import torch.distributed as dist
import zmq

import pipeline
from pipeline.core.events import EventsConfig, EventsKind
from pipeline.core.l3 import PageObject
from pipeline.core.l3_keys import object_keys
from pipeline.engine.events import block_hash


def brief(event: object) -> tuple:
    fields = msgspec.to_builtins(event)
    return fields["type"], fields.get("medium"), fields.get("block_hashes", [])


def loopback_events() -> EventsConfig:
    """events=zmq on two free loopback ports."""
    first = eventfns.free_ports(2)
    return EventsConfig(
        kind=EventsKind.zmq,
        endpoint=f"tcp://127.0.0.1:{first}",
        replay_endpoint=f"tcp://127.0.0.1:{first + 1}",
    )


def test_a_reused_host_page_says_its_old_page_removed_and_a_freed_one_goes() -> None:
    config = loopback_events()
    events = eventfns.tier_events(config, dp_rank=3, block_size=4)
    a, b, c = "a" * 32, "b" * 32, "c" * 32
    subscriber = eventfns.Subscriber([])
    try:
        events.keyed([a], [1, 2, 3, 4])
        events.host_stored([0, 1], [a, b])
        events.host_stored([0, 1], [a, b])  # nothing new: nothing said
        events.host_stored([1], [c])  # page 1 now holds c: b is gone from the host tier
        events.host_freed([0, 7])  # page 7 held nothing known
        events.l3_removed([c])
        stream = eventfns.Stream("", config.replay_endpoint or "")
        said = subscriber.replay(stream, 0)
    finally:
        subscriber.stop()
        events.close()
    shown = [[brief(e) for e in said[s].events] for s in sorted(said)]
    h = block_hash
    assert shown == [
        [("AllBlocksCleared", None, [])],
        [("BlockStored", "CPU_PINNED", [h(a)]), ("BlockStored", "CPU_PINNED", [h(b)])],
        [("BlockRemoved", "CPU_PINNED", [h(b)]), ("BlockStored", "CPU_PINNED", [h(c)])],
        [("BlockRemoved", "CPU_PINNED", [h(a)])],
        [("BlockRemoved", "DISK", [h(c)])],
    ]
    known, unknown = said[1].events  # a's names are known, b's are not: two runs
    assert (known.token_ids, known.block_size, unknown.token_ids) == ([1, 2, 3, 4], 4, [])
    assert {batch.dp_rank for batch in said.values()} == {3}


def test_a_backup_with_the_wrong_count_of_keys_moves_nothing(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        overrides = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"]
        job = pipeline.compose([*overrides, f"storage.path={tmp_path}"])
        engine = pipeline.create_engine(job)
        page = job.model.page_size
        host = engine.host_slots.alloc(2 * page)
        keys = engine.l3_keys(list(range(2 * page)))
        with pytest.raises(ValueError, match="1 keys for 2 pages"):
            engine.backup(host, torch.arange(2 * page), keys=keys[:1])
        assert engine.host_allocator.num_with_data() == 0 and not engine.acks.pending
        engine.close()
    finally:
        dist.destroy_process_group()


def test_an_evicted_objects_name_gives_back_its_page_key_whatever_its_share() -> None:
    key = "0123456789abcdef" * 2
    names = [PageObject(share, ()).name("v2-space", key) for share in ("", "-s1of2")]
    assert object_keys("v2-space", [*names, "other/01/" + key]) == [key, key]


@pytest.mark.parametrize(
    "module", ["vllm.distributed.kv_events", "sglang.srt.disaggregation.kv_events"]
)
def test_every_batch_decodes_with_the_engines_own_types(module: str) -> None:
    """vLLM's `KVEventBatch` requires every BlockStored field (`lora_name` too) and each
    event's `medium`; SGLang's reads the same map. Both decode a whole replayed stream."""
    engine_types = pytest.importorskip(module)
    config = loopback_events()
    events = eventfns.tier_events(config, dp_rank=1, block_size=2)
    a, b = "a" * 32, "b" * 32
    try:
        events.keyed([a, b], [1, 2, 3, 4])
        events.host_stored([0, 1], [a, b])
        events.l3_stored([a, b])
        events.host_freed([0])
        events.l3_removed([b])
        kept = eventfns.replayed(zmq.Context.instance(), config.replay_endpoint or "", 0)
    finally:
        events.close()
    decode = msgspec.msgpack.Decoder(engine_types.KVEventBatch).decode
    batches = [decode(kept[seq]) for seq in sorted(kept)]
    shown = [[brief(e) for e in batch.events] for batch in batches]
    h = block_hash
    assert shown == [
        [("AllBlocksCleared", None, [])],
        [("BlockStored", "CPU_PINNED", [h(a), h(b)])],
        [("BlockStored", "DISK", [h(a), h(b)])],
        [("BlockRemoved", "CPU_PINNED", [h(a)])],
        [("BlockRemoved", "DISK", [h(b)])],
    ]
    stored = batches[1].events[0]
    assert (stored.token_ids, stored.block_size, stored.lora_name) == ([1, 2, 3, 4], 2, None)
    assert [msgspec.to_builtins(batch)[2] for batch in batches] == [1] * 5  # the dp rank


def test_the_replay_counts_are_scraped_where_events_are_on(one_rank: None) -> None:
    config = loopback_events()
    off = ["model=tiny_mla", "topology=tp1", "topology.device=cpu"]
    on = [*off, "events=zmq", f"events.endpoint={config.endpoint}"]
    on.append(f"events.replay_endpoint={config.replay_endpoint}")
    shown = []
    for overrides in (off, on):
        engine = pipeline.create_engine(pipeline.compose(overrides))
        try:
            stats = engine.stats()
        finally:
            engine.close()
        shown.append({k: v for k, v in stats.items() if k.startswith("hicache_events_")})
    replay = {"hicache_events_replay_refused_total": 0, "hicache_events_replay_waiting": 0}
    assert shown == [{}, replay]
