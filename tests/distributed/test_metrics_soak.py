"""A soak with `runtime.metrics_port` serves every rank's `/metrics` over HTTP while it runs:
a scrape taken mid-soak shows bytes, L3 hits and latency buckets, each no more than the rank's
`engine.stats()` at the end (counters only grow), and the soak prints their summary."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_ports
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.distributed


def scrape(port: int) -> dict[str, float] | None:
    """The rank's samples as `stats()` names them; None while it does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "rank"}
            shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            found[f"{s.name}{{{shown}}}" if shown else s.name] = s.value
    return found


def test_a_soak_serves_metrics_that_grow_to_its_final_stats(tmp_path: Path) -> None:
    base = free_ports(2)
    overrides = ["topology=tp2", "storage=file", f"storage.path={tmp_path}"]
    # cycles enough for a scrape of both ranks mid-run (about 0.1 s a cycle on 2 cores)
    overrides += ["soak.cycles=150", "soak.warmup_cycles=10", f"runtime.metrics_port={base}"]
    soak = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "soak", *overrides, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    mid: dict[int, dict[str, float]] = {}
    deadline = time.monotonic() + 300  # a bound on a wedged soak, not a timing check
    while len(mid) < 2 and soak.poll() is None and time.monotonic() < deadline:
        for rank in range(2):
            found = scrape(base + rank)
            if found and found.get("hicache_load_seconds_count", 0) > 0:
                mid.setdefault(rank, found)
        time.sleep(0.2)
    out, err = soak.communicate(timeout=600)
    assert soak.returncode == 0, err
    assert sorted(mid) == [0, 1], "both ranks answered while the soak ran"
    result = json.loads(out)
    assert len(result["stats"]) == 2
    for rank, final in enumerate(result["stats"]):
        seen = mid[rank]
        host = 'hicache_bytes_total{direction="backup",tier="host"}'
        for key in (host, "hicache_l3_hits_total", "hicache_load_seconds_count"):
            assert 0 < seen[key] <= final[key], (rank, key)
        assert seen["hicache_l3_misses_total"] <= final["hicache_l3_misses_total"]
        buckets = [k for k in seen if k.startswith("hicache_load_seconds_bucket")]
        assert len(buckets) == len([k for k in final if k.startswith("hicache_load_seconds_b")])
        assert set(seen) <= set(final) | {k for k in seen if k.endswith("_created")}
        summary = result["metrics"][rank]
        assert summary["latency"]["load"]["count"] == final["hicache_load_seconds_count"]
        assert summary["bytes"]["host backup"] == final[host]
