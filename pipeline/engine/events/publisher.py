"""The wire and the publisher: vLLM's and SGLang's KV-event structs (msgspec), and a ZeroMQ PUB
socket with a replay ROUTER socket (`replay.Replays`) on a thread of their own (see
`pipeline.engine.events`)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import msgspec
import zmq

from pipeline.core.checks import ConfigError, Problem
from pipeline.core.events import EventsConfig, offset
from pipeline.engine.events.replay import Kept, Replays, open_replays


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
    locality: str | None = None
    """vLLM's: where a `STORAGE` medium lies (`LOCAL`, `REMOTE`); left out when null."""


class BlockRemoved(KVCacheEvent):
    """Pages a tier (`medium`) no longer holds."""

    block_hashes: list[int]
    medium: str | None
    locality: str | None = None


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
    batches `publish` queues in order, each with the next sequence number.

    A replay client may have at most `replay_window` batches unread: beyond them its replay
    waits (`replay_waiting`) and goes on once it reads, while the PUB socket and the other
    clients go on; a replay answers what was published before its request, less what has
    fallen out of the `buffer_steps` kept meanwhile. At most `replay_clients` connections are
    held: one beyond them is closed as it is accepted (`replay_refused`)."""

    def __init__(self, config: EventsConfig, index: int, dp_rank: int) -> None:
        self.dp_rank, self.topic = dp_rank, config.topic.encode()
        self.endpoint = offset(config.endpoint, index)
        replay = config.replay_endpoint
        self.replay_endpoint = None if replay is None else offset(replay, index)
        self.replay_window, self.replay_clients = config.replay_window, config.replay_clients
        self._queue: queue.SimpleQueue[EventBatch | None] = queue.SimpleQueue()
        self._kept: Kept = deque(maxlen=config.buffer_steps)
        self._seq = 0
        self._replays: Replays | None = None
        self._bound = threading.Event()
        self._error: tuple[str, zmq.ZMQError] | None = None
        """The key whose endpoint would not bind, and why."""
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            self._thread.join()
            key, error = self._error
            bound = self.endpoint if key == "events.endpoint" else self.replay_endpoint
            message = (
                f"{key}: cannot bind {bound} (publisher {index}'s port, docs/events.md): "
                f"{error.strerror}; pick a free port"
            )
            raise ConfigError([Problem(key, message)]) from error

    def publish(self, events: list[KvEvent]) -> None:
        self._queue.put(EventBatch(time.time(), events, self.dp_rank))

    def close(self) -> None:
        """Send what is queued, then close both sockets."""
        self._queue.put(None)
        self._thread.join()

    @property
    def replay_refused(self) -> int:
        """Replay connections closed beyond `replay_clients` since it opened."""
        return 0 if self._replays is None else self._replays.refused

    @property
    def replay_waiting(self) -> int:
        """Replay clients whose replay waits now for them to read."""
        return 0 if self._replays is None else self._replays.waiting

    def counts(self) -> dict[str, int]:
        """The replay's counts, as the engine's metrics read them."""
        return {"replay_refused": self.replay_refused, "replay_waiting": self.replay_waiting}

    def _run(self) -> None:
        context = zmq.Context()
        pub = context.socket(zmq.PUB)
        key = "events.endpoint"
        try:
            pub.setsockopt(zmq.LINGER, 1000)
            pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                key = "events.replay_endpoint"
                window, clients = self.replay_window, self.replay_clients
                self._replays = open_replays(
                    context, self.replay_endpoint, window, clients, self.topic
                )
        except zmq.ZMQError as e:
            self._error = key, e
        self._bound.set()
        try:
            if self._error is None:
                self._serve(pub, self._replays)
        finally:
            pub.close()
            if self._replays is not None:
                self._replays.close()
            context.term()

    def _serve(self, pub: zmq.Socket, replays: Replays | None) -> None:
        """Send each queued batch; answer a replay request once every batch queued before it
        is sent (a caller that publishes, then asks, gets what it published); between
        batches, count the replay connections and send on the replays that wait."""
        encode = msgspec.msgpack.Encoder().encode
        while True:
            if replays is not None:
                replays.watch()  # first: shut a connection beyond the cap before its request
                if replays.asked():
                    going = self._send_queued(pub, encode)
                    replays.answer(self._kept, self._seq)
                    if not going:
                        return
                    continue
                replays.resume(self._kept, self._seq)
            wait_s = 0.02 if replays is None else replays.wait_s()
            try:
                batch = self._queue.get(timeout=wait_s)
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
