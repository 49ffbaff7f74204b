"""The publisher's replay ROUTER socket: each request answered with the kept batches from its
start sequence, at most `replay_window` of them unread by its client at a time, from at most
`replay_clients` connections (see `Publisher`). Runs on the publisher's thread alone."""

from __future__ import annotations

import math
import socket
import time
from collections import deque
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's last frame: no more batches."""
ROUND_S = 0.02
"""How often the parked replays are looked at while none of their clients reads: the
publisher's queue wait, so a busy stream of batches does not pay a look per batch."""
PAUSE_S = (0.001, 0.25)
"""How long a parked replay waits before it is tried again: the shortest after a try that
sent something (its client reads: a window a millisecond, so a replay of thousands of
batches takes about a second), doubling after each try that sent nothing (a client that
stopped reading costs a failed send, some 5 us, a quarter second)."""
Kept = deque[tuple[bytes, bytes]]
"""The batches kept for replay, (8-byte sequence, payload), consecutive, the oldest first."""


@dataclass
class Cursor:
    """One client's replay that its window held up: the next sequence to send, and the end:
    the sequence published next when it asked (it gets what was published before)."""

    client: bytes
    next_seq: int
    end_seq: int
    pause_s: float = PAUSE_S[0]
    retry_at: float = 0.0


class Replays:
    """The ROUTER socket and the monitor that counts its connections, with the replays that
    wait for their clients to read (`waiting`) and the connections closed beyond the cap
    (`refused`); both plain ints another thread may read."""

    def __init__(
        self, router: zmq.Socket, monitor: zmq.Socket, max_clients: int, topic: bytes
    ) -> None:
        self.router, self.monitor, self.max_clients = router, monitor, max_clients
        self.topic = topic
        """Each replayed batch's first frame, as vLLM's and SGLang's replays send it."""
        self.port = int(router.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self.connections: set[int] = set()
        """The fds of the connections accepted within the cap and not yet closed."""
        self.parked: dict[bytes, Cursor] = {}
        self.refused = 0
        self.waiting = 0
        self._due_at = math.inf
        """When the parked replays are next looked at."""

    def watch(self) -> None:
        """Count the connections accepted and closed since last time; shut those beyond the
        cap (libzmq sees its fd end, closes it and says DISCONNECTED)."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int(event["value"])
            if event["event"] != zmq.EVENT_ACCEPTED:
                self.connections.discard(fd)  # DISCONNECTED or CLOSED (the listener's own fd)
            elif fd in self.connections or len(self.connections) < self.max_clients:
                self.connections.add(fd)  # (an fd held already was closed unheard: reused)
            elif shut_down(fd, self.port):
                self.refused += 1

    def asked(self) -> bool:
        return bool(self.router.poll(0))

    def answer(self, kept: Kept, end_seq: int) -> None:
        """Answer one request (identity, '', start sequence) with every kept batch from it
        before `end_seq`, then END; what its client's window cannot take yet waits."""
        frames = self.router.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # not a replay request: nothing to answer
        client, start = frames[0], int.from_bytes(frames[2], "big")
        # A client that asks again while its replay waits gets the new one instead: it asks
        # from where it stands now, and one cursor a client keeps what it can hold at one
        # window however often it asks.
        self.parked.pop(client, None)
        cursor = Cursor(client, start, end_seq)
        if not self._send(cursor, kept, end_seq):
            self.parked[client] = cursor
            cursor.retry_at = time.monotonic() + cursor.pause_s
            self._due_at = min(self._due_at, cursor.retry_at)
        self.waiting = len(self.parked)

    def resume(self, kept: Kept, next_seq: int) -> None:
        """Send on the parked replays that are due (`PAUSE_S`): looked at every millisecond
        while one of their clients reads, else every `ROUND_S`."""
        now = time.monotonic()
        if now < self._due_at:
            return
        reading = False
        for client, cursor in list(self.parked.items()):
            if cursor.retry_at > now:
                continue
            sent_from = cursor.next_seq
            if self._send(cursor, kept, next_seq):
                del self.parked[client]
                continue
            moved = cursor.next_seq != sent_from
            reading = reading or moved
            cursor.pause_s = PAUSE_S[0] if moved else min(2 * cursor.pause_s, PAUSE_S[1])
            cursor.retry_at = now + cursor.pause_s
        self._due_at = math.inf if not self.parked else now + (PAUSE_S[0] if reading else ROUND_S)
        self.waiting = len(self.parked)

    def wait_s(self) -> float:
        """How long the publisher may wait for a batch before the parked replays are due."""
        return max(0.0, min(ROUND_S, self._due_at - time.monotonic()))

    def _send(self, cursor: Cursor, kept: Kept, next_seq: int) -> bool:
        """Send what `cursor` has left, never waiting: True once its END went or its client
        is gone, False when the client's window is full. Batches that fell out of `kept`
        meanwhile are skipped: the client sees the gap in the sequence numbers."""
        first = next_seq - len(kept)
        try:
            while (at := max(cursor.next_seq, first)) < cursor.end_seq:
                seq, payload = kept[at - first]
                frames = (cursor.client, b"", self.topic, seq, payload)  # as the PUB sent it
                self.router.send_multipart(frames, zmq.NOBLOCK)
                cursor.next_seq = at + 1
            self.router.send_multipart((cursor.client, b"", b"", END_SEQ, b""), zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
        return True  # sent, or its client is gone (EHOSTUNREACH)

    def close(self) -> None:
        self.router.disable_monitor()
        self.monitor.close(linger=0)
        self.router.close(linger=0)


def open_replays(
    context: zmq.Context, endpoint: str, window: int, max_clients: int, topic: bytes
) -> Replays:
    """A ROUTER bound to `endpoint` that refuses to queue more than `window` batches for a
    client (ROUTER_MANDATORY: a full one raises Again, a gone one EHOSTUNREACH) and whose
    monitor tells its connections, to cap them at `max_clients`."""
    router = context.socket(zmq.ROUTER)
    monitor = None
    try:
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, window)  # before bind: each connection's pipe takes it
        router.setsockopt(zmq.LINGER, 0)
        events = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
        monitor = router.get_monitor_socket(events)
        router.bind(endpoint)
    except zmq.ZMQError:
        if monitor is not None:
            router.disable_monitor()
            monitor.close(linger=0)
        router.close(linger=0)
        raise
    return Replays(router, monitor, max_clients, topic)


def shut_down(fd: int, port: int) -> bool:
    """Shut down the TCP connection `fd` if it is one on local `port` (True); any other fd,
    or one already closed, is left alone. libzmq owns the fd and closes it itself."""
    try:
        connection = socket.socket(fileno=fd)
    except OSError:
        return False  # closed meanwhile, or not a socket
    try:
        ours = connection.family in (socket.AF_INET, socket.AF_INET6)
        ours = ours and connection.type == socket.SOCK_STREAM
        if not ours or connection.getsockname()[1] != port:
            return False
        connection.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        connection.detach()  # never close an fd libzmq owns
