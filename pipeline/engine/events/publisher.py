"""The wire and the publisher: vLLM's and SGLang's KV-event structs (msgspec), and a ZeroMQ PUB
socket with a replay ROUTER socket on a thread of their own (see `pipeline.engine.events`)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from pipeline.core.events import EventsConfig, offset

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's last frame: no more batches."""


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """A tagged msgpack map: `type` holds the class name."""


class BlockStored(KVCacheEvent):
    """Pages a tier (`medium`) now holds: their block hashes, their token ids where known
    (every page's, in order; else none), tokens a page. Fields without a default are always
    sent, null or not: vLLM's decoder requires each of them (`lora_name` included), and
    SGLang's reads them all."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    """Pages a tier (`medium`) no longer holds."""

    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    """Every tier holds nothing this publisher said before: its first event."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    """One message's events: the array [ts, events, dp_rank]."""

    ts: float
    events: list[KvEvent]
    dp_rank: int | None = None


def block_hash(key: str) -> int:
    """A page key's block hash in the events: its first 64 bits as a signed int."""
    return int.from_bytes(bytes.fromhex(key[:16]), "big", signed=True)


class Publisher:
    """A PUB socket and a replay ROUTER socket on a thread of their own, publishing the
    batches `publish` queues in order, each with the next sequence number."""

    def __init__(self, config: EventsConfig, index: int, dp_rank: int) -> None:
        self.dp_rank, self.topic = dp_rank, config.topic.encode()
        self.endpoint = offset(config.endpoint, index)
        replay = config.replay_endpoint
        self.replay_endpoint = None if replay is None else offset(replay, index)
        self._queue: queue.SimpleQueue[EventBatch | None] = queue.SimpleQueue()
        self._kept: deque[tuple[bytes, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._bound = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            self._thread.join()
            raise RuntimeError(
                f"events: cannot bind {self.endpoint} / {self.replay_endpoint} ({self._error}); "
                "pick free ports with events.endpoint and events.replay_endpoint"
            ) from self._error

    def publish(self, events: list[KvEvent]) -> None:
        self._queue.put(EventBatch(time.time(), events, self.dp_rank))

    def close(self) -> None:
        """Send what is queued, then close both sockets."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        context = zmq.Context()
        pub, replay = context.socket(zmq.PUB), context.socket(zmq.ROUTER)
        try:
            pub.setsockopt(zmq.LINGER, 1000)
            pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                replay.bind(self.replay_endpoint)
        except zmq.ZMQError as e:
            self._error = e
        self._bound.set()
        try:
            if self._error is None:
                self._serve(pub, replay)
        finally:
            pub.close()
            replay.close(linger=0)
            context.term()

    def _serve(self, pub: zmq.Socket, replay: zmq.Socket) -> None:
        """Send each queued batch; answer a replay request once every batch queued before it
        is sent (a caller that publishes, then asks, gets what it published)."""
        encode = msgspec.msgpack.Encoder().encode
        while True:
            if replay.poll(0):
                going = self._send_queued(pub, encode)
                self._replay(replay)
                if not going:
                    return
                continue
            try:
                batch = self._queue.get(timeout=0.02)
            except queue.Empty:
                continue
            if batch is None:
                return
            self._send(pub, encode(batch))

    def _send_queued(self, pub: zmq.Socket, encode: Callable[[EventBatch], bytes]) -> bool:
        """Send every batch queued now; False once `close` asked to stop."""
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return True
            if batch is None:
                return False
            self._send(pub, encode(batch))

    def _send(self, pub: zmq.Socket, payload: bytes) -> None:
        """One batch, under the next sequence number, kept for replays."""
        frame = (self._seq.to_bytes(8, "big"), payload)
        pub.send_multipart((self.topic, *frame))
        self._kept.append(frame)
        self._seq += 1

    def _replay(self, replay: zmq.Socket) -> None:
        """Answer one request (identity, '', start sequence): every kept batch from it."""
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # not a replay request: nothing to answer
        client, start = frames[0], int.from_bytes(frames[2], "big")
        for seq, payload in self._kept:
            if int.from_bytes(seq, "big") >= start:
                replay.send_multipart((client, b"", seq, payload))
        replay.send_multipart((client, b"", END_SEQ, b""))
