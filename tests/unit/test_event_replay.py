"""The replay socket is bounded: a client that never reads holds at most `replay_window`
batches of the publisher's memory while its replay waits, connections beyond
`replay_clients` are closed as they are accepted (and counted), and a client that reads gets
every batch it asked for, in order, then END. Real sockets on loopback; the idle clients live
in a child process, so that what they take in is not counted as the publisher's memory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import eventfns
import msgspec
import zmq

from pipeline.core.events import EventsConfig, EventsKind
from pipeline.engine.events import BlockStored, EventBatch, Publisher
from pipeline.engine.events.publisher import KvEvent
from pipeline.engine.events.replay import shut_down

PATIENCE_S = 60.0
"""How long a test waits for the publisher or a client before it gives up (not a bound it
checks)."""
IDLE_CLIENTS = r"""
import os, sys, zmq
context = zmq.Context()
clients = []
for _ in range(int(sys.argv[2])):
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.RCVHWM, 1)
    client.setsockopt(zmq.RCVBUF, 4096)
    client.connect(sys.argv[1])
    client.send_multipart((b"", bytes(8)))  # from sequence 0; never read
    clients.append(client)
print("asked", flush=True)
sys.stdin.read()  # until the test closes it
os._exit(0)
"""


def batch(i: int) -> list[KvEvent]:
    """What a backup of 64 pages of 64 tokens says: 64 block hashes (64-bit) and 4096 token
    ids of a 32K vocabulary, some 13 KB of msgpack."""
    hashes = [(i * 64 + j) * 0x9E3779B97F4A7C15 % 2**63 for j in range(64)]
    tokens = [(i * 4096 + j * 7) % 32_000 for j in range(64 * 64)]
    return [BlockStored(hashes, None, tokens, 64, None, "CPU_PINNED", None)]


def batch_bytes() -> int:
    return len(msgspec.msgpack.encode(EventBatch(0.0, batch(0), 0)))


def kernel_batches() -> int:
    """Batches a connection whose client reads nothing may take into the kernel's buffers
    before the publisher's window fills: the sender's at most tcp_wmem's largest, counted
    twice for the receiver's."""
    largest = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return 2 * largest // batch_bytes()


@contextmanager
def publishing(num_batches: int, window: int, max_clients: int = 512) -> Iterator[Publisher]:
    """A publisher on loopback that has published `num_batches` batches and keeps them all,
    under `replay_window=window` and `replay_clients=max_clients`."""
    first = eventfns.free_ports(2)
    config = EventsConfig(
        kind=EventsKind.zmq,
        endpoint=f"tcp://127.0.0.1:{first}",
        replay_endpoint=f"tcp://127.0.0.1:{first + 1}",
        buffer_steps=num_batches,
        replay_window=window,
        replay_clients=max_clients,
    )
    publisher = Publisher(config, 0, 0)
    try:
        for i in range(num_batches):
            publisher.publish(batch(i))
        yield publisher
    finally:
        publisher.close()


@contextmanager
def zmq_context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


def replay_endpoint(publisher: Publisher) -> str:
    assert publisher.replay_endpoint is not None
    return publisher.replay_endpoint


def asking(context: zmq.Context, publisher: Publisher, start: int) -> zmq.Socket:
    """A client that asked for a replay from `start` and reads nothing ahead (so the
    publisher's window fills while it does not read); a connection closed stays closed."""
    client = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.setsockopt(zmq.RCVHWM, 1)
    client.setsockopt(zmq.RCVBUF, 4096)
    client.setsockopt(zmq.RECONNECT_IVL, -1)
    client.connect(replay_endpoint(publisher))
    client.send_multipart((b"", start.to_bytes(8, "big")))
    return client


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never: {what}")
        time.sleep(0.01)


def received(clients: list[zmq.Socket], finished: int) -> list[list[int]]:
    """The sequence numbers each client receives (END as -1) until `finished` of them have
    received END."""
    poller = zmq.Poller()
    for client in clients:
        poller.register(client, zmq.POLLIN)
    got: list[list[int]] = [[] for _ in clients]
    while sum(seqs[-1:] == [-1] for seqs in got) < finished:
        ready = dict(poller.poll(int(PATIENCE_S * 1000)))
        if not ready:
            raise TimeoutError("a replay never ended")
        for i, client in enumerate(clients):
            if client in ready and got[i][-1:] != [-1]:
                _, _, seq, _ = client.recv_multipart()
                got[i].append(int.from_bytes(seq, "big", signed=True))
    return got


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_300_clients_that_never_read_hold_little_and_a_reader_still_gets_it_all() -> None:
    """Each idle client holds at most its window (the default 4 batches, some 13 KB each)
    and its connection's state in the publisher: ~30 MB for 300 of them, where the old
    replay queued up to libzmq's 1000 batches a client (~4 GB here)."""
    num_batches = max(2000, kernel_batches() + 100)
    window = EventsConfig.replay_window  # the default
    with publishing(num_batches, window) as publisher, zmq_context() as context:
        endpoint = replay_endpoint(publisher)
        eventfns.replayed(context, endpoint, num_batches - 1)  # every batch encoded, kept
        before = rss_bytes()
        command = [sys.executable, "-c", IDLE_CLIENTS, endpoint, "300"]
        pipe = subprocess.PIPE
        with subprocess.Popen(command, stdin=pipe, stdout=pipe, text=True) as idle:
            assert idle.stdin is not None and idle.stdout is not None
            try:
                assert idle.stdout.readline() == "asked\n"
                until(lambda: publisher.replay_waiting == 300, "300 replays wait")
                grown = rss_bytes() - before
                whole = eventfns.replayed(context, endpoint, 0)
            finally:
                idle.stdin.close()
        until(lambda: publisher.replay_waiting == 0, "the gone clients' replays dropped")
    assert grown < 64 * 2**20, f"the publisher grew by {grown / 2**20:.0f} MB"
    assert list(whole) == list(range(num_batches))  # in order, then END
    decode = msgspec.msgpack.Decoder(EventBatch).decode
    assert decode(whole[7]).events == batch(7)


def test_connections_beyond_replay_clients_are_closed_and_counted() -> None:
    num_batches = kernel_batches() + 100
    with publishing(num_batches, window=4, max_clients=4) as publisher, zmq_context() as context:
        clients = [asking(context, publisher, 0) for _ in range(10)]
        until(lambda: publisher.replay_refused == 6, "6 connections refused")
        until(lambda: publisher.replay_waiting == 4, "the 4 held clients' replays wait")
        got = received(clients, finished=4)
        until(lambda: publisher.replay_waiting == 0, "the 4 replays ended")
        refused = [client.poll(0) for client, seqs in zip(clients, got, strict=True) if not seqs]
        assert publisher.replay_refused == 6
    assert sorted(got, key=len) == [[]] * 6 + [[*range(num_batches), -1]] * 4
    assert refused == [0] * 6  # nothing came to a closed connection


def test_a_client_that_reads_late_gets_every_batch_then_end() -> None:
    num_batches = kernel_batches() + 100
    with publishing(num_batches, window=4) as publisher, zmq_context() as context:
        client = asking(context, publisher, 0)
        until(lambda: publisher.replay_waiting == 1, "the replay waits")
        (got,) = received([client], finished=1)
        until(lambda: publisher.replay_waiting == 0, "the replay ended")
    assert got == [*range(num_batches), -1]


def test_batches_dropped_while_a_replay_waits_are_skipped() -> None:
    """The replay answers what was kept when it was asked; what falls out of the buffer
    meanwhile is a gap (the client may have taken in some while the later batches came), and
    nothing published after the request is sent."""
    num_batches = kernel_batches() + 100
    with publishing(num_batches, window=4) as publisher, zmq_context() as context:
        client = asking(context, publisher, 0)
        until(lambda: publisher.replay_waiting == 1, "the replay waits")
        for i in range(num_batches, 2 * num_batches):
            publisher.publish(batch(i))
        later = eventfns.replayed(context, replay_endpoint(publisher), 0)
        (got,) = received([client], finished=1)
    assert list(later) == list(range(num_batches, 2 * num_batches))  # the first all dropped
    sent = got[:-1]
    assert got[-1] == -1 and sent[0] == 0 and sent == sorted(set(sent))  # in order, then END
    assert sent[-1] < num_batches and len(sent) < num_batches  # some skipped, none later


def test_a_second_request_replaces_a_waiting_replay() -> None:
    num_batches = kernel_batches() + 100
    with publishing(num_batches, window=4) as publisher, zmq_context() as context:
        client = asking(context, publisher, 0)
        until(lambda: publisher.replay_waiting == 1, "the replay waits")
        client.send_multipart((b"", (num_batches - 10).to_bytes(8, "big")))
        (got,) = received([client], finished=1)
        until(lambda: publisher.replay_waiting == 0, "the replay ended")
    head, tail = got[:-11], got[-11:]
    assert tail == [*range(num_batches - 10, num_batches), -1]  # the one END: the second's
    assert head == list(range(len(head))) and len(head) < num_batches - 10


def test_an_fd_not_proven_a_replay_connection_is_left_alone() -> None:
    """Refusing a connection shuts down the fd libzmq accepted only if it is a TCP socket on
    the replay port: a pipe, another port's socket or a closed fd is left as it was."""
    read, write = os.pipe()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert not shut_down(read, port)
        assert not shut_down(other.fileno(), port + 1)
        os.write(write, b"x")
        assert os.read(read, 1) == b"x"  # the pipe still open
        with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S):
            pass  # the listener still listens
    os.close(read)
    os.close(write)
    assert not shut_down(read, port)
