"""KV events: what a router or a scheduler learns of the host and L3 tiers (`events` group).

`EventsConfig` is the typed schema of the `events` config group; the publisher is
`pipeline.engine.events`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from pipeline.core.checks import Problem, at_least, raise_problems

ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[\w.-]+):(\d{1,5})")
"""A TCP endpoint a publisher binds: tcp://host:port (an IPv6 host in brackets)."""


class EventsKind(Enum):
    """none: publish nothing (no socket, no thread); zmq: vLLM's KV-event wire format over
    ZeroMQ."""

    none = "none"
    zmq = "zmq"


@dataclass(kw_only=True)
class EventsConfig:
    """Where this engine publishes which pages each tier holds."""

    kind: EventsKind = EventsKind.none
    """none (default: nothing is published, no socket is opened) or zmq."""
    endpoint: str = "tcp://127.0.0.1:5557"
    """zmq: the PUB socket's address; publisher i of the world binds port + i (one per
    replica group under single_source and rotating, one per rank under replicated). A config
    file may name only a loopback host; any other comes from the command line or the library
    call."""
    replay_endpoint: str | None = "tcp://127.0.0.1:5567"
    """zmq: the ROUTER socket a late subscriber asks for batches from a sequence number
    (port + i as endpoint's); null: no replay."""
    topic: str = ""
    """zmq: the topic frame of every message."""
    buffer_steps: int = 10_000
    """zmq: batches kept for replay (the oldest dropped first)."""

    def __post_init__(self) -> None:
        found = at_least("events", self, buffer_steps=1)
        for key, value in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            if key == "replay_endpoint" and value is None:
                continue
            if not isinstance(value, str) or not ENDPOINT.fullmatch(value):
                message = f"events.{key}={value!r}: tcp://host:port (a host, or [IPv6])"
                found.append(Problem(f"events.{key}", message))
        if self.replay_endpoint is not None and self.replay_endpoint == self.endpoint:
            message = "events.replay_endpoint: another port than events.endpoint"
            found.append(Problem("events.replay_endpoint", message))
        raise_problems(found)

    @property
    def on(self) -> bool:
        return self.kind is EventsKind.zmq


def host_of(endpoint: str) -> str:
    """The host an endpoint names (brackets of an IPv6 host removed)."""
    found = ENDPOINT.fullmatch(endpoint)
    host = found.group(1) if found else endpoint
    return host.strip("[]")


def offset(endpoint: str, index: int) -> str:
    """`endpoint` with its port moved on by `index` (publisher `index` of the world)."""
    head, _, port = endpoint.rpartition(":")
    return f"{head}:{int(port) + index}"
