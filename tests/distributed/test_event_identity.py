"""Two TP2 engines in one world of 4 on one config, each on a group the caller made (as a
serving engine runs data-parallel replicas): their publishers bind ports apart, carry
distinct data-parallel ranks, and name each page by the block hash the engine gave
`page_keys`, as the engine's own events do; every batch, live and replayed from sequence 0,
decodes with the consumer's own types (vLLM's for `events.media=vllm`, SGLang's for
`sglang`)."""

from __future__ import annotations

from pathlib import Path

import eventfns
import msgspec
import pytest
from conftest import job_config

pytestmark = pytest.mark.distributed

DECODERS = {"vllm": "vllm.distributed.kv_events", "sglang": "sglang.srt.disaggregation.kv_events"}
STORE = {"vllm": ("STORAGE", "LOCAL"), "sglang": ("DISK", None)}
HOST = {"vllm": "CPU", "sglang": "CPU_PINNED"}


def sglang_int64(digest: str) -> int:
    """SGLang's own int64 of its hex block hash, as its radix cache's events send it."""
    utils = pytest.importorskip("sglang.srt.mem_cache.utils")
    return utils.hash_str_to_int64(digest)


@pytest.mark.parametrize(
    ("strategy", "media"), [("replicated", "vllm"), ("single_source", "sglang")]
)
def test_two_engines_in_one_world_publish_apart_under_their_own_names(
    strategy: str, media: str, tmp_path: Path
) -> None:
    engine_types = pytest.importorskip(DECODERS[media])
    store, flags = tmp_path / "store", tmp_path / "flags"
    store.mkdir()
    flags.mkdir()
    ports = (eventfns.free_ports(4), eventfns.free_ports(4))
    job = job_config(
        f"strategy={strategy}",
        "model=tiny_dsa",
        "topology=tp2",
        "storage=file",
        f"storage.path={store}",
        f"workload.num_tokens={eventfns.PAGES * 4}",
        "events=zmq",
        f"events.media={media}",
        f"events.endpoint=tcp://127.0.0.1:{ports[0]}",
        f"events.replay_endpoint=tcp://127.0.0.1:{ports[1]}",
    )
    per_engine = 2 if strategy == "replicated" else 1  # publishers: a rank's, or a group's
    streams = [
        eventfns.Stream(f"tcp://127.0.0.1:{ports[0] + i}", f"tcp://127.0.0.1:{ports[1] + i}")
        for i in range(2 * per_engine)
    ]
    subscriber = eventfns.Subscriber(streams)
    replays: dict[int, dict[int, bytes]] = {}

    def replay_all() -> None:  # while the ranks wait, their publishers still open
        for rank in range(4):
            eventfns.wait_for(flags / f"done-{rank}")
        for i, stream in enumerate(streams):
            replays[i] = eventfns.replayed(subscriber.context, stream.replay, 0)
        (flags / "replayed").touch()

    dp_ranks = eventfns.launched_beside(
        eventfns.two_engines, (job, str(flags)), 4, replay_all, subscriber
    )
    publishing = [0, 1, 2, 3] if per_engine == 2 else [0, 2]  # single_source: a group's first
    assert dp_ranks == [r // 2 if r in publishing else -1 for r in range(4)]
    decode = msgspec.msgpack.Decoder(engine_types.KVEventBatch).decode
    for i, stream in enumerate(streams):
        engine = i // per_engine
        whole = {seq: decode(payload) for seq, payload in replays[i].items()}
        assert sorted(whole) == list(range(len(whole))) and len(whole) >= 2
        for seq, batch in stream.live.items():  # the live stream: the replayed bytes
            assert msgspec.msgpack.encode(batch) == replays[i][seq]
        # the third field: vLLM's data_parallel_rank, SGLang's attn_dp_rank
        assert {msgspec.to_builtins(batch)[2] for batch in whole.values()} == {engine}
        hashes, parent, tokens = eventfns.engine_hashes(engine, media)
        if media == "sglang":
            hashes, parent = [sglang_int64(h) for h in hashes], sglang_int64(parent)
        stored = [e for b in whole.values() for e in b.events if type(e).__name__ == "BlockStored"]
        host = [e for e in stored if e.medium == HOST[media]]
        assert [(e.block_hashes, e.parent_block_hash, e.token_ids) for e in host] == [
            (hashes, parent, tokens)
        ]
        said = [msgspec.to_builtins(e) for e in stored[1:]]  # SGLang's types have no locality
        in_store = [(e["block_hashes"], e["medium"], e.get("locality")) for e in said]
        writer = i % per_engine == 0  # the store's events: the group's first rank's
        assert in_store == ([(hashes, *STORE[media])] if writer else [])
