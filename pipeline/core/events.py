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


PORT_MAX = 65535


class EventsKind(Enum):
    """none: publish nothing (no socket, no thread); zmq: vLLM's KV-event wire format over
    ZeroMQ."""

    none = "none"
    zmq = "zmq"


class EventsMedia(Enum):
    """Whose names the events give the tiers: SGLang's (host `CPU_PINNED`, file store `DISK`,
    Mooncake `EXTERNAL`) or vLLM's (host `CPU`, either store `STORAGE` with a `locality`:
    `LOCAL` for the file store, `REMOTE` for Mooncake)."""

    sglang = "sglang"
    vllm = "vllm"


@dataclass(kw_only=True)
class EventsConfig:
    """Where this engine publishes which pages each tier holds."""

    kind: EventsKind = EventsKind.none
    """none (default: nothing is published, no socket is opened) or zmq."""
    endpoint: str = "tcp://127.0.0.1:5557"
    """zmq: the PUB socket's address; publisher j of the engine with data-parallel rank d
    binds port + d x P + j, P its publishers (one per replica group under single_source and
    rotating, one per rank under replicated). A config file may name only a loopback host;
    any other comes from the command line or the library call."""
    replay_endpoint: str | None = "tcp://127.0.0.1:5567"
    """zmq: the ROUTER socket a late subscriber asks for batches from a sequence number
    (its port moved on as endpoint's); null: no replay."""
    topic: str = ""
    """zmq: the topic frame of every message."""
    buffer_steps: int = 10_000
    """zmq: batches kept for replay (the oldest dropped first)."""
    media: EventsMedia = EventsMedia.sglang
    """zmq: whose names the tiers get: sglang (CPU_PINNED, DISK, EXTERNAL) or vllm (CPU,
    STORAGE with locality LOCAL or REMOTE)."""
    dp_rank: int | None = None
    """zmq: this engine's data-parallel rank d, which moves its ports on (see endpoint) and
    makes its batches' dp_rank d x A + the attention group's index (A = tp_size /
    attn_tp_size); null: its first global rank / tp_size."""
    replay_window: int = 4
    """zmq: batches one replay client may have unread; its replay waits (the others go on)
    until it reads them."""
    replay_clients: int = 512
    """zmq: replay connections held at once; one beyond them is closed as it is accepted
    (counted in hicache_events_replay_refused)."""

    def __post_init__(self) -> None:
        found = at_least(
            "events", self, buffer_steps=1, dp_rank=0, replay_window=1, replay_clients=1
        )
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


def engine_of(config: EventsConfig, first_rank: int, tp_size: int) -> int:
    """The engine's data-parallel rank: `events.dp_rank`, else its first global rank /
    tp_size (ConfigError where that rank is not a multiple: engines of unequal sizes)."""
    if config.dp_rank is not None:
        return config.dp_rank
    if first_rank % tp_size:
        message = (
            f"events.dp_rank: null, and the engine's first global rank {first_rank} is not a "
            f"multiple of topology.tp_size={tp_size}: give each engine its events.dp_rank"
        )
        raise_problems([Problem("events.dp_rank", message)])
    return first_rank // tp_size


def port_problems(
    config: EventsConfig, publishers: int, engines: range, metrics: range | None
) -> list[Problem]:
    """The ports `engines` (data-parallel ranks) of `publishers` publishers each bind: each
    within 65535, the PUB and replay ports apart, neither among `metrics`' ports (each rank
    serves its metrics on metrics_port + its global rank)."""
    if not config.on or not engines:
        return []
    found = []
    spans = {"events.endpoint": _span(config.endpoint, publishers, engines)}
    if config.replay_endpoint is not None:
        spans["events.replay_endpoint"] = _span(config.replay_endpoint, publishers, engines)
    for key, span in spans.items():
        if span.stop - 1 > PORT_MAX:
            most = PORT_MAX - (span.stop - span.start) + 1
            message = (
                f"{key}: {publishers} publisher(s) an engine at data-parallel rank(s) "
                f"{_shown(engines)} bind ports {_shown(span)}, beyond {PORT_MAX}: a port of "
                f"at most {most}"
            )
            found.append(Problem(key, message))
    others = {"runtime.metrics_port": metrics} if metrics else {}
    pairs = [("events.replay_endpoint", "events.endpoint")]
    pairs += [(key, other) for key in spans for other in others]
    named = spans | others
    for key, other in pairs:
        if key in named and _overlap(named[key], named[other]):
            message = (
                f"{key}: ports {_shown(named[key])} overlap {other}'s {_shown(named[other])}: "
                f"move one at least {max(len(named[key]), len(named[other]))} ports away"
            )
            found.append(Problem(key, message))
    return found


def _span(endpoint: str, publishers: int, engines: range) -> range:
    port = int(endpoint.rpartition(":")[2])  # a checked endpoint, as `offset` reads it
    return range(port + engines.start * publishers, port + engines.stop * publishers)


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _shown(span: range) -> str:
    return str(span.start) if len(span) == 1 else f"{span.start}-{span.stop - 1}"
