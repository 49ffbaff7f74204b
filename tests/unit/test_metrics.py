"""Prometheus metrics of an engine: what a scrape of `/metrics` shows is what `engine.stats()`
says, sample by sample, and the numbers are the ones the engine moved (bytes per tier and
direction, L3 hits and misses, a corrupt object, latency buckets, host occupancy)."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import free_ports
from prometheus_client.parser import text_string_to_metric_families

import pipeline
from pipeline.core.checks import ConfigError

TINY = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "workload.num_tokens=16"]
PAGE_BYTES = 5 * 4 * 64  # tiny_mla: a page of 4 tokens of 5 layers of 64 B rows


def free_port() -> int:
    return free_ports(1)


def scraped(port: int) -> dict[str, float]:
    """`/metrics` as `stats()` names its samples (rank label left out, `_created` too)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            assert sample.labels.get("rank") == "0", sample
            labels = {k: v for k, v in sample.labels.items() if k != "rank"}
            shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            found[f"{sample.name}{{{shown}}}" if shown else sample.name] = sample.value
    return found


def test_a_scrape_shows_what_stats_says_and_what_moved(one_rank: None, tmp_path: Path) -> None:
    port = free_port()
    job = pipeline.compose(
        [*TINY, "storage=file", f"storage.path={tmp_path}", f"runtime.metrics_port={port}"]
    )
    engine = pipeline.create_engine(job)
    try:
        page = engine.sizing.slots_per_page
        device, host = torch.arange(0, 4 * page), engine.host_slots.alloc(4 * page)
        engine.backup(host, device).wait()
        keys = engine.l3_keys(list(range(4 * page)))
        engine.write_back(keys, host).wait()
        engine.load(host, torch.arange(4 * page, 8 * page)).done().wait()
        assert engine.lookup([*keys, "0" * 32]) == 4  # the 5th key names nothing
        (obj,) = [p for p in tmp_path.rglob("*") if p.is_file() and keys[3] in p.name]
        raw = bytearray(obj.read_bytes())
        raw[-1] ^= 0xFF  # the last unit's last byte: its CRC-32C no longer matches
        obj.write_bytes(bytes(raw))
        engine.host_slots.reuse(host)
        loaded = engine.load_from_l3(keys, host, torch.arange(8 * page, 12 * page))
        assert loaded.hits == 3 and loaded.handle is not None
        loaded.handle.done().wait()
        while engine.acks.pending:
            engine.poll()
        stats = engine.stats()
        assert scraped(port) == stats
    finally:
        engine.close()
    moved = 4 * PAGE_BYTES
    assert stats['hicache_bytes_total{direction="backup",tier="host"}'] == moved
    assert stats['hicache_bytes_total{direction="write",tier="l3"}'] == moved
    assert stats['hicache_bytes_total{direction="read",tier="l3"}'] == 3 * PAGE_BYTES
    assert stats['hicache_bytes_total{direction="load",tier="host"}'] == moved + 3 * PAGE_BYTES
    assert (stats["hicache_l3_hits_total"], stats["hicache_l3_misses_total"]) == (4, 1)
    assert stats["hicache_l3_corrupt_objects_total"] == 1
    assert stats["hicache_l3_forged_objects_total"] == 0  # unkeyed: damage is corruption
    assert stats["hicache_l3_read_misses_total"] == 1
    assert stats["hicache_l3_evictions_total"] == 0
    for op in ("backup", "load", "write_back", "fetch"):
        count = 2 if op == "load" else 1  # the load-back and the L3 load's one window
        assert stats[f"hicache_{op}_seconds_count"] == count, op
        assert stats[f'hicache_{op}_seconds_bucket{{le="+Inf"}}'] == count, op
    assert stats["hicache_host_capacity_pages"] == engine.sizing.host.num_pages
    assert stats["hicache_host_allocated_pages"] == 4


def test_the_listener_stops_with_the_engine(one_rank: None) -> None:
    port = free_port()
    engine = pipeline.create_engine(pipeline.compose([*TINY, f"runtime.metrics_port={port}"]))
    assert engine.metrics.port == port
    engine.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free again


def test_a_port_in_use_is_refused_naming_the_knob(one_rank: None) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = pipeline.compose([*TINY, f"runtime.metrics_port={port}"])
        with pytest.raises(ConfigError) as refused:
            pipeline.create_engine(job)
    (problem,) = refused.value.problems
    assert problem.key == "runtime.metrics_port"
    assert f"port {port} on 127.0.0.1 (rank 0's, metrics_port + its rank) is in use" in str(problem)


def test_run_on_a_busy_metrics_port_exits_2_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "run", *TINY, f"runtime.metrics_port={port}"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (said,) = [line for line in done.stderr.splitlines() if not line.startswith("[")]  # no logs
    assert said.startswith("error: runtime.metrics_port: ") and f"port {port} " in said
    assert said.endswith("is in use; pick a free port or leave it null")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("runtime.metrics_port=0", "runtime.metrics_port=0 must lie in [1, 65535] (or null: none)"),
        (
            "runtime.metrics_port=70000",
            "runtime.metrics_port=70000 must lie in [1, 65535] (or null: none)",
        ),
        (
            "runtime.metrics_address=' '",
            "runtime.metrics_address must name an address, e.g. 127.0.0.1",
        ),
    ],
)
def test_metrics_knobs_out_of_range_are_refused(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        pipeline.compose([*TINY, override])
    assert [p.message for p in refused.value.problems] == [message]
