"""`bench bench=ttft` as a user runs it, on CPU ranks (gloo): a row per store, strategy and
new-token count, its arithmetic, every overlapped run waiting per layer and bit-exact, the
outputs written. Timings are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.jobs.bench.forward import TINY, forward_flops

pytestmark = pytest.mark.distributed


def ttft_bench(tmp_path: Path, *overrides: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "bench",
            "bench=ttft",
            "bench.sizes=[64]",
            "bench.new_tokens=[4,16]",
            "bench.repeats=1",
            "bench.warmup=0",
            f"bench.out_dir={tmp_path / 'out'}",
            *overrides,
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check_rows(
    result: dict, stores: list[str], strategies: list[str], streams: tuple[str, ...] = ()
) -> None:
    """`streams`: the strategies whose loads from L3 stream (storage.stream_layers)."""
    rows = result["rows"]
    assert [(r["store"], r["strategy"], r["new_tokens"]) for r in rows] == [
        (store, strategy, new) for store in stores for strategy in strategies for new in (4, 16)
    ]
    assert result["ok"]
    for r in rows:
        assert r["bit_exact"] and r["hits_ok"] and r["waits_per_layer"]
        assert r["ideal_ms"] == max(r["load_ms"], r["compute_ms"])
        assert r["x_ideal"] == pytest.approx(r["overlapped_ms"] / r["ideal_ms"])
        assert r["hit_vs_recompute"] == pytest.approx(r["recompute_ms"] / r["overlapped_ms"])
        assert r["flops"] == r["issued_flops"] == forward_flops(TINY, 5, 64, r["new_tokens"])
        assert r["recompute_flops"] == forward_flops(TINY, 5, 0, 64 + r["new_tokens"])
        # the cost model prices the load; the forward is the measured one, overlapping the
        # load where it uses each layer as it arrives, after it where it waits for all of L3
        assert r["load_estimate_ms"] > 0
        assert r["streamed"] == (r["store"] != "none" and r["strategy"] in streams)
        if r["store"] == "none" or r["streamed"]:
            assert r["estimate_ms"] == max(r["load_estimate_ms"], r["compute_ms"])
        else:
            assert r["estimate_ms"] == pytest.approx(r["load_estimate_ms"] + r["compute_ms"])
        assert r["x_estimate"] == pytest.approx(r["overlapped_ms"] / r["estimate_ms"])


def test_ttft_bench_rows_for_host_hits_and_a_file_store(tmp_path: Path) -> None:
    """The replicated rows stream their loads from the file store; single_source and
    rotating, whose loads exchange layers, read whole objects."""
    result = ttft_bench(tmp_path, "bench.stores=[none,file]", "storage.stream_layers=2")
    strategies = ["replicated", "single_source", "rotating"]
    check_rows(result, ["none", "file"], strategies, streams=("replicated",))
    out = tmp_path / "out"
    assert json.loads((out / "bench_ttft.json").read_text())["rows"] == result["rows"]
    text = (out / "bench_ttft.md").read_text()
    assert "| overlapped ms | ideal ms | x ideal | recompute ms | hit vs recompute |" in text


def test_ttft_bench_on_one_rank_says_which_strategies_it_did_not_measure(tmp_path: Path) -> None:
    result = ttft_bench(tmp_path, "topology=tp1", "bench.stores=[none]")
    check_rows(result, ["none"], ["replicated"])
    assert {s["strategy"] for s in result["skipped"]} == {"single_source", "rotating"}
    assert (
        "- not measured: rotating (none, 64 tokens)" in (tmp_path / "out/bench_ttft.md").read_text()
    )


@pytest.mark.mooncake
def test_ttft_bench_rows_for_a_mooncake_store(tmp_path: Path) -> None:
    result = ttft_bench(tmp_path, "bench.stores=[mooncake]", "bench.strategies=[replicated]")
    check_rows(result, ["mooncake"], ["replicated"])
