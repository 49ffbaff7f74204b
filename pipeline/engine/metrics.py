"""Prometheus metrics of one rank's engine (prometheus_client), named `hicache_*` and labelled
by rank.

The counts are what the engine keeps anyway (the op trace's counts and bytes, the store's
counters, the host slots, the KV-event replay's counts), read when a scrape asks, so the issue
path pays nothing for them. The HTTP listener is `engine.metrics_listener`.
The latency histograms are observed when `Engine.poll` releases an ack (submission to release:
what a scheduler waits) and when a load from L3 returns. Each engine has its own registry, and
`stats()` reads the same registry a scrape does, so the two agree.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipeline.core.checks import ConfigError, Problem
from pipeline.core.slots import PageAllocator
from pipeline.engine.events import KvEvents
from pipeline.engine.l3.tier import L3Tier
from pipeline.engine.metrics_listener import MAX_CONNECTIONS as MAX_CONNECTIONS
from pipeline.engine.metrics_listener import listener
from pipeline.engine.transfer.state import Trace

LATENCY_BUCKETS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
"""Seconds: a small request's backup (~100 us) to a 64K-token load from a cold store."""
TIMED = {
    "backup": "Backup latency: submitted to released by the ack poll",
    "load": "Load-back latency: submitted to released by the ack poll",
    "write_back": "Write-back latency: submitted to released by the ack poll",
    "fetch": "Load from L3: the call, its reads and the window loads it issued",
}
BYTES = {
    ("host", "backup"): ("copy", "d2h"),
    ("host", "load"): ("copy", "h2d"),
    ("peer", "sent"): ("broadcast", "sent"),
    ("peer", "received"): ("broadcast", "received"),
    ("l3", "write"): ("l3_write", ""),
    ("l3", "read"): ("l3_read", ""),
    ("l3", "sent_to_writer"): ("l3_send", ""),
}
"""(tier, direction) of `hicache_bytes_total` -> the op trace's (kind, side) it sums."""


@dataclass(frozen=True)
class Readings:
    """What a scrape reads from the engine, at once."""

    op_counts: dict[str, int]
    op_bytes: dict[tuple[str, str], int]
    l3_pages: dict[str, int]
    """Pages a lookup found ("hits") or did not find ("misses") at the front of its keys."""
    store: dict[str, int | None] = field(default_factory=dict)
    """The store's own counts (evictions...) and holdings (None: not known here)."""
    host_pages: dict[str, int] = field(default_factory=dict)
    """Host slots in pages: capacity, allocated, holding data."""
    events: dict[str, int] = field(default_factory=dict)
    """The KV-event publisher's replay counts (`Publisher.counts`; empty: no events)."""


Read = Callable[[Readings], int | None]


def _op(kind: str) -> Read:
    return lambda now: now.op_counts.get(kind, 0)  # an op the trace never saw counts 0


def _store(key: str) -> Read:
    return lambda now: now.store.get(key)  # None: this store does not know it


def _host(key: str) -> Read:
    return lambda now: now.host_pages.get(key)


def _events(key: str) -> Read:
    return lambda now: now.events.get(key)  # None: this engine publishes no events


SERIES: dict[str, tuple[type[CounterMetricFamily | GaugeMetricFamily], str, Read]] = {
    "l3_hits": (
        CounterMetricFamily,
        "Pages an L3 lookup found at the front of its keys",
        lambda now: now.l3_pages["hits"],
    ),
    "l3_misses": (
        CounterMetricFamily,
        "Pages an L3 lookup did not find",
        lambda now: now.l3_pages["misses"],
    ),
    "l3_write_admitted_pages": (CounterMetricFamily, "Pages written back", _op("l3_admitted")),
    "l3_write_declined_pages": (
        CounterMetricFamily,
        "Pages a write-back left out: named fewer than storage.admit_after_hits times",
        _op("l3_declined"),
    ),
    "l3_write_dropped_pages": (
        CounterMetricFamily,
        "Pages a write-back left out: storage.write_back_queue_pages were queued ahead of it",
        _op("l3_dropped"),
    ),
    "l3_read_misses": (
        CounterMetricFamily,
        "L3 loads that met a missing or unreadable page",
        _op("l3_miss"),
    ),
    "l3_corrupt_objects": (
        CounterMetricFamily,
        "L3 objects whose header or a unit's CRC-32C did not match",
        _op("l3_corrupt"),
    ),
    "l3_forged_objects": (
        CounterMetricFamily,
        "L3 objects the store's key does not authenticate: written without it, with another "
        "key, or forged",
        _op("l3_forged"),
    ),
    "l3_fallbacks": (
        CounterMetricFamily,
        "L3 loads whose ranks disagreed on the plan and read every unit",
        _op("l3_fallback"),
    ),
    "l3_evictions": (
        CounterMetricFamily,
        "Objects this rank evicted from the store to stay under its capacity",
        _store("evictions"),
    ),
    "l3_evicted_bytes": (
        CounterMetricFamily,
        "Bytes this rank evicted from the store",
        _store("evicted_bytes"),
    ),
    "host_capacity_pages": (GaugeMetricFamily, "Host slots, in pages", _host("capacity")),
    "host_allocated_pages": (GaugeMetricFamily, "Host pages allocated", _host("allocated")),
    "host_data_pages": (GaugeMetricFamily, "Host pages holding data", _host("data")),
    "store_objects": (GaugeMetricFamily, "Objects a bounded file store holds", _store("objects")),
    "store_bytes": (GaugeMetricFamily, "Bytes a bounded file store holds", _store("bytes")),
    "events_replay_refused": (
        CounterMetricFamily,
        "Replay connections closed beyond events.replay_clients",
        _events("replay_refused"),
    ),
    "events_replay_waiting": (
        GaugeMetricFamily,
        "Replay clients whose replay waits for them to read",
        _events("replay_waiting"),
    ),
}
"""Every series but the bytes and the latencies: its type, doc and how it reads the engine's
numbers; a value the engine does not know is left out of the scrape."""


class _EngineCollector(Collector):
    """Reads the engine's numbers when scraped."""

    def __init__(self, rank: str, read: Callable[[], Readings]) -> None:
        self.rank, self.read = rank, read

    def collect(self) -> Iterator[Metric]:
        now, rank = self.read(), self.rank
        doc = "Bytes moved per tier and direction"
        moved = CounterMetricFamily("hicache_bytes", doc, labels=["rank", "tier", "direction"])
        for (tier, direction), key in BYTES.items():
            moved.add_metric([rank, tier, direction], now.op_bytes.get(key, 0))
        yield moved
        for name, (family_of, doc, read) in SERIES.items():
            value = read(now)
            if value is not None:
                family = family_of(f"hicache_{name}", doc, labels=["rank"])
                family.add_metric([rank], value)
                yield family


class EngineMetrics:
    """One engine's registry: the read-at-scrape numbers and the latency histograms, and the
    HTTP listener that serves them when asked for."""

    def __init__(self, rank: int, read: Callable[[], Readings]) -> None:
        self.rank = rank
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(str(rank), read))
        self.latency = {
            op: Histogram(
                f"hicache_{op}_seconds",
                doc,
                ["rank"],
                buckets=LATENCY_BUCKETS,
                registry=self.registry,
            ).labels(rank=str(rank))
            for op, doc in TIMED.items()
        }
        self._server: tuple[WSGIServer, threading.Thread] | None = None

    def observe(self, op: str, seconds: float) -> None:
        self.latency[op].observe(seconds)

    def serve(self, address: str, port: int) -> None:
        """Serve `/metrics` on address:port until `close`, at most `MAX_CONNECTIONS` clients
        at once (ConfigError naming runtime.metrics_port when the port is in use)."""
        try:
            server = listener(address, port, make_wsgi_app(self.registry))
        except OSError as e:
            whose = f"rank {self.rank}'s, metrics_port + its rank"
            if e.errno == errno.EADDRINUSE:
                said = f"port {port} on {address} ({whose}) is in use"
            else:
                said = f"cannot listen on {address}:{port} ({whose}): {e.strerror or e}"
            message = f"runtime.metrics_port: {said}; pick a free port or leave it null"
            raise ConfigError([Problem("runtime.metrics_port", message)]) from e
        thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
        thread.start()
        self._server = server, thread

    @property
    def port(self) -> int | None:
        """The port it serves on (None: not serving)."""
        return None if self._server is None else self._server[0].server_port

    def stats(self) -> dict[str, float]:
        """Every sample, as a scrape shows it less the rank label: `name{label="v",...}`."""
        found = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # when a series started, not a number it counts
                labels = {k: v for k, v in sample.labels.items() if k != "rank"}
                shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                found[f"{sample.name}{{{shown}}}" if shown else sample.name] = sample.value
        return found

    def close(self) -> None:
        """Stop the listener (its port is free again when this returns)."""
        if self._server is not None:
            server, thread = self._server
            self._server = None
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def readings(
    trace: Trace,
    slots: PageAllocator,
    l3: L3Tier | None,
    l3_pages: dict[str, int],
    events: KvEvents | None = None,
) -> Readings:
    """What a scrape of an engine's metrics reads (see `engine.metrics`)."""
    counts, moved = trace.totals()
    host = {
        "capacity": slots.num_pages,
        "allocated": slots.num_pages - slots.num_free,
        "data": slots.num_with_data(),
    }
    store = {} if l3 is None else l3.store.stats()
    said = {} if events is None else events.publisher.counts()
    return Readings(counts, moved, dict(l3_pages), store, host, said)
