"""`bench` as a user runs it, on CPU ranks (gloo): every case bit-exact, chunked backups timed in
turn with the same backup unchunked, and the outputs written. Timings are not asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed


def test_bench_times_chunked_backups_in_turn_with_unchunked(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "bench",
            "model=tiny_dsa",
            "bench.sizes=[512]",
            "bench.placements=[fragmented]",
            "bench.strategies=[replicated,rotating]",
            "bench.chunk_pages=[0,2]",
            "bench.repeats=2",
            "bench.warmup=1",
            "bench.floor_bytes=100000",
            f"bench.out_dir={out}",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    cases = {(r["direction"], r["chunk_pages"], r["strategy"]) for r in rows}
    assert len(rows) == len(cases) == 8  # 2 directions x 2 chunk settings x 2 strategies
    assert all(r["bit_exact"] and r["reference_bit_exact"] for r in rows)
    # each row's issue time beside the hand loop's (the same calls, the least Python)
    assert all(r["issue_ms"] > 0 and r["reference_issue_ms"] > 0 for r in rows)
    # the best repetition's issue time: at most the median, on the slowest rank as well
    assert all(0 < r["best_issue_ms"] <= r["issue_ms"] for r in rows)
    # every row names what it issued on each rank: a load's copies where the rank holds the
    # layer, its broadcasts where rotating owners exchange them
    for r in rows:
        assert len(r["ops"]) == 2 and all(sum(ops.values()) > 0 for ops in r["ops"]), r
        if r["direction"] == "load" and r["strategy"] == "rotating":
            assert all(ops.get("broadcast", 0) > 0 for ops in r["ops"]), r["ops"]
    assert "hand loop issue ms" in (out / "bench.md").read_text()
    assert "| best issue ms |" in (out / "bench.md").read_text()
    in_turn = [r for r in rows if "x_unchunked" in r]
    assert {(r["direction"], r["chunk_pages"]) for r in in_turn} == {("backup", 2)}
    assert len(in_turn) == 2
    for r in in_turn:
        assert r["unchunked_ms"] > 0
        assert r["x_unchunked"] == pytest.approx(r["ms"] / r["unchunked_ms"])
        # each side issues what it claims: the unchunked backup gathers no batch and moves
        # the units the rank holds of each pool kind in one call (kernel backend: tiny_dsa's
        # kv units, then its index-K units, or a rotating rank's share of them); the chunked
        # one moves its 128 pages in 64 batches, one step per pool kind, each one launch
        # from the device pages to the host, no batch gathered (a size other than the
        # workload's: each case sizes its own pools)
        assert r["unchunked_ops"] == [{"copy": 2}, {"copy": 2}]
        assert r["ops"] == [{"copy": 128}] * 2
    assert "chunked / unchunked" in (out / "bench.md").read_text()
    assert json.loads((out / "bench.json").read_text())["rows"] == rows


@pytest.mark.mooncake
def test_l3_bench_puts_the_strategies_side_by_side_per_store(tmp_path: Path) -> None:
    """Each side reads what it claims: replicated on every rank, single_source on the first,
    rotating each owner's share; every load bit-exact; the stores put away after."""
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "bench",
            "bench=l3",
            "model=tiny_dsa",
            "bench.sizes=[256]",
            "bench.repeats=2",
            "bench.caches=[warm,cold]",
            f"bench.out_dir={out}",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    direct = not json.loads(done.stdout)["notes"]  # O_DIRECT cases unless tmpfs refused
    stores = [("file", "warm", "buffered"), ("file", "cold", "buffered")]
    stores += [("file", "cold", "direct")] if direct else []
    assert [(r["store"], r["cache"], r["io"], r["strategy"]) for r in rows] == [
        (*store, strategy)
        for store in (*stores, ("mooncake", "warm", "buffered"))
        for strategy in ("replicated", "single_source", "rotating")
    ]
    unique = 256 * 272  # tiny_dsa bytes per token
    for r in rows:
        assert r["bit_exact"] and r["unique_bytes"] == unique and r["fallbacks"] == 0
        assert 0 < r["fetch_ms"] <= r["ms"]  # the L3 part of the load, timed within it
        reads = r["l3_read_bytes_per_rank"]
        expected = {
            "replicated": [unique, unique],
            "single_source": [unique, 0],
            "rotating": reads if sum(reads) == unique and all(reads) else None,
        }[r["strategy"]]
        assert reads == expected
        side = next(
            q
            for q in rows
            if (q["store"], q["cache"], q["io"], q["strategy"])
            == (r["store"], r["cache"], r["io"], "replicated")
        )
        assert r["x_replicated"] == pytest.approx(side["ms"] / r["ms"])
        # every row is held to the limits measured in the same run on its own objects
        limits, gbps = r["limits"], r["gbps"]
        if r["store"] == "file":
            assert set(limits["warm_read_gbps"]) == {"1", "4", str(os.cpu_count())}
            assert all(v > 0 for v in limits["warm_read_gbps"].values())
            assert limits["h2d_gbps"] > 0 and limits["write_gbps"] > 0
            assert limits["read_copy_gbps"] > 0 and limits["ranged_gbps"] > 0
            assert r["x_read_copy"] == pytest.approx(gbps / limits["read_copy_gbps"])
            limit = {
                ("warm", "buffered"): limits["warm_read_gbps"]["4"],
                ("cold", "buffered"): limits["cold_read_gbps"] or limits["warm_read_gbps"]["4"],
                ("cold", "direct"): limits["direct_read_gbps"],
            }[r["cache"], r["io"]]
            assert r["x_write"] > 0
        else:
            limit = limits["raw_gbps"]
        assert r["x_limit"] == pytest.approx(gbps / limit)
    text = (out / "bench_l3.md").read_text()
    assert re.search(r"\| mooncake \| warm \| buffered \| 256 \| \w+ \| rotating \|", text)
    assert "Limits measured in the same run" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
