"""How the KV events name a page: the engine's own block hash given to `page_keys`, in the
form the engine's own events send it (checked with SGLang's and vLLM's own conversions), a
run of pages per `BlockStored` that chains, and each consumer's media names, decoded by
vLLM's own types."""

from __future__ import annotations

import hashlib
import pickle

import eventfns
import msgspec
import pytest
import zmq

import pipeline
from pipeline.core.checks import ConfigError
from pipeline.core.events import EventsConfig, EventsKind, EventsMedia, engine_of
from pipeline.core.l3_keys import PageKey
from pipeline.engine.events import block_hash
from pipeline.engine.events.names import PageNames, wire_hash

SGLANG = hashlib.sha256(b"page").hexdigest()
VLLM = hashlib.sha256(b"vllm page").digest()


def test_an_sglang_hash_is_sent_as_sglangs_own_events_send_it() -> None:
    utils = pytest.importorskip("sglang.srt.mem_cache.utils")
    for digest in (SGLANG, "f" * 64, "0" * 64):
        assert wire_hash(digest, "a" * 32) == utils.hash_str_to_int64(digest)


def test_vllm_bytes_are_sent_as_vllms_own_events_send_them() -> None:
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    assert wire_hash(VLLM, "a" * 32) == utils.maybe_convert_block_hash(VLLM)  # its default


def test_ints_go_as_given_and_what_has_no_engine_form_as_the_keys_hash() -> None:
    for given in (5, -5, (1 << 64) - 1, -(1 << 63)):
        assert wire_hash(given, "a" * 32) == given
    assert wire_hash(1 << 70 | 7, "a" * 32) == 7  # its low 64 bits
    assert wire_hash("not-hex", "ab" * 16) == block_hash("ab" * 16)


def test_page_keys_remember_the_engines_hashes_through_a_pickle() -> None:
    job = pipeline.compose(["model=tiny_mla", "topology=tp1"])
    page = job.model.page_size
    keys = pipeline.page_keys(job, [7, 8], parent=6, token_ids=list(range(2 * page)))
    assert keys == pipeline.page_keys(job, [7, 8])  # the same keys, named or not
    again = pickle.loads(pickle.dumps(keys))  # as a key crosses to another process
    said = [(k.block_hash, k.parent, k.token_ids) for k in again if isinstance(k, PageKey)]
    assert said == [(7, 6, tuple(range(page))), (8, 7, tuple(range(page, 2 * page)))]
    with pytest.raises(ValueError, match=f"token_ids: 3 for 2 pages: .* {page} a page"):
        pipeline.page_keys(job, [7, 8], token_ids=[1, 2, 3])
    with pytest.raises(ValueError, match="parent=True: a bool is not a block hash"):
        pipeline.page_keys(job, [7], parent=True)


def test_a_stored_event_is_one_chain_of_pages() -> None:
    names = PageNames(2)
    job = pipeline.compose(["model=tiny_mla", "topology=tp1"])
    first, second = pipeline.page_keys(job, [1, 2]), pipeline.page_keys(job, [9], parent=2)
    other = pipeline.page_keys(job, [40])  # another prefix's first page
    plain = "c" * 32  # a key the engine never named
    runs = names.stored([*first, *second, *other, plain], ("CPU", None))
    shown = [(e.block_hashes, e.parent_block_hash) for e in runs]
    assert shown == [([1, 2, 9], None), ([40], None), ([block_hash(plain)], None)]
    assert names.removed([first[1]], ("CPU", None)).block_hashes == [2]
    # a store eviction names its objects by key alone: the remembered name
    assert names.removed([str(second[0])], ("STORAGE", "LOCAL")).block_hashes == [9]


def test_vllms_own_types_read_vllm_media_and_its_hashes() -> None:
    engine_types = pytest.importorskip("vllm.distributed.kv_events")
    config = EventsConfig(kind=EventsKind.zmq, media=EventsMedia.vllm)
    first = eventfns.free_ports(2)
    config.endpoint, config.replay_endpoint = (
        f"tcp://127.0.0.1:{first}",
        f"tcp://127.0.0.1:{first + 1}",
    )
    job = pipeline.compose(["model=tiny_mla", "topology=tp1"])
    page = job.model.page_size
    keys = pipeline.page_keys(job, [VLLM, VLLM[::-1]], token_ids=list(range(2 * page)))
    events = eventfns.tier_events(config, dp_rank=2, block_size=page)
    try:
        events.host_stored([0, 1], keys)
        events.l3_stored(keys)
        events.l3_removed([str(keys[0])])
        kept = eventfns.replayed(zmq.Context.instance(), config.replay_endpoint, 0)
    finally:
        events.close()
    decode = msgspec.msgpack.Decoder(engine_types.KVEventBatch).decode
    said = [e for seq in sorted(kept) for e in decode(kept[seq]).events][1:]
    convert = pytest.importorskip("vllm.v1.core.kv_cache_utils").maybe_convert_block_hash
    hashes = [convert(VLLM), convert(VLLM[::-1])]  # as vLLM's own events name them
    assert [(type(e).__name__, e.medium, e.locality, e.block_hashes) for e in said] == [
        ("BlockStored", "CPU", None, hashes),
        ("BlockStored", "STORAGE", "LOCAL", hashes),
        ("BlockRemoved", "STORAGE", "LOCAL", hashes[:1]),
    ]
    assert said[0].token_ids == list(range(2 * page)) and said[0].parent_block_hash is None


def test_an_engine_of_uneven_ranks_is_asked_for_its_dp_rank() -> None:
    config = EventsConfig(kind=EventsKind.zmq)
    assert engine_of(config, 4, 2) == 2
    with pytest.raises(ConfigError, match="first global rank 3 is not a multiple of"):
        engine_of(config, 3, 2)
    config.dp_rank = 5
    assert engine_of(config, 3, 2) == 5
