"""A `create_engine` that fails after it opened a bounded file store leaves no descriptor or
thread of its own behind, wherever it fails: the metrics port or the events' port taken (a
ConfigError naming the key), the tier's threads, or the engine's own construction."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import pipeline
from pipeline.engine import factory

pytestmark = pytest.mark.usefixtures("one_rank")


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def fail(*_: object, **__: object) -> None:
    raise RuntimeError("a later step failed")


@pytest.mark.parametrize("where", ["metrics port", "events port", "tier threads", "engine"])
def test_a_failed_create_engine_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    knobs = [
        "model=tiny_mla",
        "topology=tp1",
        "topology.device=cpu",
        "storage=file",
        f"storage.path={tmp_path}",
        "storage.capacity_bytes=1MiB",
    ]
    pipeline.create_engine(pipeline.compose(knobs)).close()  # what the first engine loads
    taking = {
        "metrics port": [f"runtime.metrics_port={port}"],
        "events port": ["events=zmq", f"events.replay_endpoint=tcp://127.0.0.1:{port}"],
    }
    job = pipeline.compose([*knobs, *taking.get(where, [])])
    failing: dict[str, tuple[object, str, Callable[..., None]]] = {
        "tier threads": (factory, "WorkerStream", fail),
        "engine": (factory, "Engine", fail),
    }
    if where in failing:
        monkeypatch.setattr(*failing[where])
    before, threads = open_fds(), threading.active_count()
    with pytest.raises((RuntimeError, OSError, ValueError)) as refused:
        pipeline.create_engine(job)
    if where == "events port":
        assert f"events.replay_endpoint: cannot bind tcp://127.0.0.1:{port}" in str(refused.value)
    assert open_fds() - before == set()
    assert threading.active_count() == threads
    taken.close()
