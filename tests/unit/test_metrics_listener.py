"""The metrics listener is bounded: at most `MAX_CONNECTIONS` clients get a thread, the rest
are closed at once, and a client that sends nothing is closed after `CLIENT_TIMEOUT_S`; so
slow clients cannot take a rank's threads and file descriptors, and a scrape still answers.
Real sockets on loopback, the listener in this process (its threads and fds are counted)."""

from __future__ import annotations

import os
import select
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from pipeline.engine.metrics import MAX_CONNECTIONS, EngineMetrics, Readings

PATIENCE_S = 60.0
"""How long a client waits for the server before the test gives up (not a bound it checks)."""


def nothing() -> Readings:
    return Readings(op_counts={}, op_bytes={}, l3_pages={"hits": 0, "misses": 0})


@pytest.fixture
def listener() -> Iterator[EngineMetrics]:
    metrics = EngineMetrics(0, nothing)
    metrics.serve("127.0.0.1", 0)
    try:
        yield metrics
    finally:
        metrics.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def idle_clients(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send nothing."""
    clients = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
        clients.append(s)
    return clients


def closed_by_server(clients: list[socket.socket], at_least: int) -> set[socket.socket]:
    """Wait until the server closed at least `at_least` of `clients` (each read gives EOF)."""
    closed: set[socket.socket] = set()
    while len(closed) < at_least:
        waiting = [s for s in clients if s not in closed]
        readable, _, _ = select.select(waiting, [], [], PATIENCE_S)
        if not readable:
            break
        for s in readable:
            assert s.recv(1) == b""  # an idle client is never sent a byte, only closed
            closed.add(s)
    return closed


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE_S) as r:
        return str(r.read().decode())


def test_idle_clients_beyond_the_cap_are_closed_not_given_a_thread_each(
    listener: EngineMetrics,
) -> None:
    assert listener.port is not None
    threads, fds, many = threading.active_count(), open_fds(), 200
    clients = idle_clients(listener.port, many)
    try:
        # the ones beyond the cap are closed at once; the held ones only after the timeout
        closed_by_server(clients, at_least=many - MAX_CONNECTIONS)
        # one more than the cap: a client's thread ends just after it frees its place
        assert threading.active_count() <= threads + MAX_CONNECTIONS + 1
        assert open_fds() - fds - many <= MAX_CONNECTIONS + 1  # the server's side of each
        # every held one is closed by the timeout, and the listener serves again
        assert len(closed_by_server(clients, at_least=many)) == many
        assert "hicache_l3_hits_total" in scrape(listener.port)
    finally:
        for s in clients:
            s.close()


def test_a_client_that_sends_nothing_is_closed_by_the_server(listener: EngineMetrics) -> None:
    assert listener.port is not None
    with socket.create_connection(("127.0.0.1", listener.port), timeout=PATIENCE_S) as idle:
        assert idle.recv(1) == b""  # EOF from the server, long before the client's patience


def test_a_scrape_answers_while_slow_clients_hold_all_but_one_connection(
    listener: EngineMetrics,
) -> None:
    assert listener.port is not None
    clients = idle_clients(listener.port, MAX_CONNECTIONS - 1)
    try:
        assert "hicache_l3_hits_total" in scrape(listener.port)
    finally:
        for s in clients:
            s.close()
