"""The HTTP listener of an engine's metrics: prometheus_client's WSGI server, bounded so that
slow or idle clients cannot take a rank's threads or file descriptors (see `engine.metrics`)."""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger("hicache-pipeline")

MAX_CONNECTIONS = 8
"""Clients the listener serves at once, a thread each; more are closed at once (a scraper
asks one at a time, so 8 leaves room for a few while none can take the rank's threads)."""
CLIENT_TIMEOUT_S = 5.0
"""A client that sends nothing (or reads nothing) for this long is closed: a scrape of a few
KB takes milliseconds."""


class _QuietHandler(WSGIRequestHandler):
    """One client's request, its socket timing out after `CLIENT_TIMEOUT_S`; no access log."""

    timeout = CLIENT_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's thread-per-client WSGI server, at most `MAX_CONNECTIONS` threads:
    a client beyond them is closed as soon as it is accepted."""

    request_queue_size = 64  # connections waiting in the kernel cost no thread
    active: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.active.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again
            self.active.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.active.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that timed out or went away: its problem, not a traceback on the rank's stderr
        log.debug("metrics client %s dropped", client_address, exc_info=True)


def listener(address: str, port: int, app: Any) -> WSGIServer:
    """A bound `_BoundedServer` for `app` on address:port (IPv4 or IPv6, as the address is)."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]

    class Server(_BoundedServer):
        """This listener's server: its address family, its own count of clients."""

        address_family = family
        active = threading.BoundedSemaphore(MAX_CONNECTIONS)

    return make_server(address, port, app, Server, handler_class=_QuietHandler)
