"""The KV-event tests' two sides: a rank that runs a scripted round of every tier's changes, and
a real ZeroMQ subscriber (pyzmq, in the test's process) that decodes what each publisher sent,
asks the replay socket for what it missed and rebuilds each tier's residency from the events."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch.distributed as dist
import zmq
from conftest import free_ports  # noqa: F401  (the event tests' ports)

import pipeline
from pipeline.config.job import Job
from pipeline.core.events import EventsConfig
from pipeline.core.slots import page_tokens
from pipeline.core.storage import StorageKind
from pipeline.engine.engine import Engine
from pipeline.engine.events import EventBatch, KvEvents, Publisher, block_hash
from pipeline.engine.events.names import MEDIA, PageNames
from pipeline.engine.factory import open_engine
from pipeline.jobs.contents import fill_random
from pipeline.jobs.launch import launch

PAGES = 4
WAIT_S = 60.0


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def scripted(args: tuple[Job, str], rank: int, world_size: int, local_rank: int) -> dict:
    """Backup (with keys), host eviction, write-back, a store eviction (a bounded file
    store), a load from L3; then what the tiers really hold (as block hashes), and wait for
    the test's subscriber to finish its replays before the publisher closes."""
    job, folder = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        held = _script(engine)
        Path(folder, f"done-{rank}").touch()
        wait_for(Path(folder, "replayed"))
        return held
    finally:
        engine.close()


def _script(engine: Engine) -> dict[str, Any]:
    size, tier = engine.sizing.slots_per_page, engine.l3
    assert tier is not None
    prefixes = [engine.l3_keys(list(range(i * 10_000, i * 10_000 + PAGES * size))) for i in (1, 2)]
    fill_random(engine, list(range(PAGES)), 3)

    def settle() -> None:
        while engine.acks.pending:
            engine.poll()
        engine.poll()  # a load's pages are said once it has landed: one more step

    for keys in prefixes:
        pages = engine.host_allocator.alloc(PAGES)
        slots = page_tokens(pages, size)
        engine.backup(slots, page_tokens(list(range(PAGES)), size), keys=keys).wait()
        settle()
        engine.write_back(keys, slots).wait()  # the second evicts some of the first
        settle()
        engine.host_allocator.free(pages)  # a host eviction
    keys = prefixes[1]
    pages = engine.host_allocator.alloc(PAGES)
    assert engine.lookup(keys) == PAGES
    loaded = engine.load_from_l3(keys, page_tokens(pages, size), page_tokens([8, 9, 10, 11], size))
    assert loaded.hits == PAGES and loaded.handle is not None
    loaded.handle.done().wait()
    settle()
    every = [k for keys in prefixes for k in keys]
    stored = tier.store.exists([tier.name(k) for k in every])
    return {
        "host": sorted(block_hash(k) for k in keys),  # the loaded prefix's pages
        "l3": sorted(block_hash(k) for k, there in zip(every, stored, strict=True) if there),
        "evicted": len(every) - sum(stored),
        "tokens": list(range(10_000, 10_000 + PAGES * size)),  # the first prefix's
        "page_tokens": size,
    }


@dataclass
class Stream:
    """What one publisher sent: batches by sequence number, from live messages and replays."""

    endpoint: str
    replay: str
    live: dict[int, EventBatch] = field(default_factory=dict)
    topics: set[bytes] = field(default_factory=set)


class Subscriber:
    """SUB sockets connected to every publisher's endpoint before the ranks bind, read on a
    thread of their own until `stop`."""

    def __init__(self, streams: list[Stream]) -> None:
        self.streams, self.context = streams, zmq.Context()
        self.decode = msgspec.msgpack.Decoder(EventBatch).decode
        self.sockets = []
        for stream in streams:
            sub = self.context.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(stream.endpoint)
            self.sockets.append(sub)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        poller = zmq.Poller()
        for sub in self.sockets:
            poller.register(sub, zmq.POLLIN)
        while not self._stop.is_set():
            for sub, _ in poller.poll(20):
                topic, seq, payload = sub.recv_multipart()
                stream = self.streams[self.sockets.index(sub)]
                stream.topics.add(topic)
                stream.live[int.from_bytes(seq, "big")] = self.decode(payload)

    def replay(self, stream: Stream, start: int) -> dict[int, EventBatch]:
        """Every batch the publisher kept from `start` on, asked of its replay socket."""
        kept = replayed(self.context, stream.replay, start)
        return {seq: self.decode(payload) for seq, payload in kept.items()}

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        for sub in self.sockets:
            sub.close(linger=0)
        self.context.term()


def replayed(context: zmq.Context, replay: str, start: int) -> dict[int, bytes]:
    """Every batch a publisher kept from `start` on, as the bytes it sent, by sequence."""
    req = context.socket(zmq.DEALER)
    req.connect(replay)
    try:
        req.send_multipart((b"", start.to_bytes(8, "big")))
        found = {}
        while True:
            if not req.poll(int(WAIT_S * 1000)):
                raise TimeoutError(f"{replay} did not answer")
            _, _, seq, payload = req.recv_multipart()  # '', topic, sequence, batch
            number = int.from_bytes(seq, "big", signed=True)
            if number == -1:
                return found
            found[number] = payload
    finally:
        req.close(linger=0)


def residency(batches: dict[int, EventBatch]) -> dict[str, set[int]]:
    """Each medium's block hashes, rebuilt from the batches in sequence order."""
    held: dict[str, set[int]] = {}
    for seq in sorted(batches):
        for event in batches[seq].events:
            kind = type(event).__name__
            if kind == "AllBlocksCleared":
                held = {}
            elif kind == "BlockStored":
                held.setdefault(event.medium, set()).update(event.block_hashes)
            else:
                held.setdefault(event.medium, set()).difference_update(event.block_hashes)
    return held


def quiet(job: Job, rank: int, world_size: int, local_rank: int) -> dict:
    """An engine under events=none, after a backup, a write-back and a host eviction: what
    of the events machinery it holds (nothing)."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        keys = engine.l3_keys(list(range(PAGES * engine.sizing.slots_per_page)))
        engine.host_allocator.free(stored(engine, keys))
        assert engine.l3 is not None
        return {
            "events": engine.events,
            "freed_hook": engine.host_allocator.freed,
            "listeners": len(engine.l3.store.counters.listeners),
            "threads": sorted(t.name for t in threading.enumerate() if t.name == "kv-events"),
        }
    finally:
        engine.close()


def tier_events(
    config: EventsConfig,
    *,
    dp_rank: int,
    block_size: int,
    store: StorageKind = StorageKind.file,
) -> KvEvents:
    """One publisher's tier events on `config`'s ports (publisher 0), named in its media."""
    media = MEDIA[config.media]
    names = PageNames(block_size)
    return KvEvents(Publisher(config, 0, dp_rank), names, media[None], media[store])


ENGINE_RANKS = [[0, 1], [2, 3]]
"""Two TP2 engines in one world of 4, each on a group the caller made."""


def engine_hashes(engine: int, media: str) -> tuple[list[Any], Any, list[int]]:
    """(block hashes, the hash before them, token ids) engine `engine` names its pages by:
    vLLM's ints, or SGLang's SHA-256 hex strings."""
    tokens = list(range(engine * 1000, engine * 1000 + PAGES * 4))
    if media == "vllm":
        return [engine * 100 + i + (1 << 62) for i in range(PAGES)], -engine - 1, tokens
    digests = [hashlib.sha256(f"{engine}-{i}".encode()).hexdigest() for i in range(PAGES + 1)]
    return digests[1:], digests[0], tokens


def two_engines(args: tuple[Job, str], rank: int, world_size: int, local_rank: int) -> int:
    """Each engine backs up and writes back its prefix under keys of its own block hashes
    (`page_keys` with the parent and token ids), then waits for the test's replays."""
    job, folder = args
    groups = [dist.new_group(members, backend="gloo") for members in ENGINE_RANKS]
    engine_index = rank // 2
    engine = pipeline.create_engine(job, group=groups[engine_index])
    try:
        hashes, parent, tokens = engine_hashes(engine_index, job.events.media.value)
        keys = pipeline.page_keys(job, hashes, parent=parent, token_ids=tokens)
        fill_random(engine, list(range(PAGES)), 5 + engine_index)
        stored(engine, keys)
        Path(folder, f"done-{rank}").touch()
        wait_for(Path(folder, "replayed"))
        return engine.events.publisher.dp_rank if engine.events is not None else -1
    finally:
        engine.close()


def stored(engine: Engine, keys: list[str]) -> list[int]:
    """Back up device pages 0.. to new host pages under `keys`, write them back, and release
    every ack: the host pages."""
    size = engine.sizing.slots_per_page
    pages = engine.host_allocator.alloc(len(keys))
    slots = page_tokens(pages, size)
    engine.backup(slots, page_tokens(list(range(len(keys))), size), keys=keys).wait()
    engine.write_back(keys, slots).wait()
    while engine.acks.pending:
        engine.poll()
    return pages


def launched_beside(
    fn: Any, payload: Any, world_size: int, beside: Any, subscriber: Subscriber
) -> list[Any] | None:
    """`launch` the ranks on gloo while `beside` runs on a thread (the test's replays), then
    stop `subscriber`."""
    helper = threading.Thread(target=beside)
    helper.start()
    try:
        return launch(fn, payload, world_size, backend="gloo", timeout_s=180)
    finally:
        helper.join()
        subscriber.stop()
