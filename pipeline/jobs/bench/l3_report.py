"""`bench bench=l3`'s summary: one row per store, size and strategy, against replicated."""

from __future__ import annotations

import statistics
from typing import Any

from pipeline.config.job import Job


def summarize_l3(ranks: list[dict], cases: list[tuple[Job, dict]], base: Job) -> dict[str, Any]:
    """One row per case: the slowest rank's median load, and its ratio to replicated's."""
    rows = []
    for i, (job, case) in enumerate(cases):
        per_rank = [r["cases"][i] for r in ranks]
        unique = case["tokens"] * job.model.bytes_per_token
        seconds = max(statistics.median(c["load_s"]) for c in per_rank)
        rows.append(
            {
                **case,
                "ms": seconds * 1e3,
                "fetch_ms": max(statistics.median(c["fetch_s"]) for c in per_rank) * 1e3,
                "write_back_ms": max(c["write_back_s"] for c in per_rank) * 1e3,
                "gbps": unique / seconds / 1e9,
                "l3_read_bytes_per_rank": [c["l3_read_bytes_per_load"] for c in per_rank],
                "fallbacks": sum(c["fallbacks"] for c in per_rank),
                "bit_exact": all(c["bit_exact"] for c in per_rank),
                "unique_bytes": unique,
            }
        )
    for row in rows:
        reference = next(
            r
            for r in rows
            if (r["store"], r["tokens"], r["strategy"])
            == (row["store"], row["tokens"], "replicated")
        )
        row["x_replicated"] = reference["ms"] / row["ms"]
    return {
        "model": base.model.name,
        "topology": base.topology.name,
        "ranks": len(ranks),
        "device_name": ranks[0].get("device_name", "cpu"),
        "page_cache": "warm: file objects are read back right after they were written",
        "rows": rows,
    }


def l3_markdown(result: dict[str, Any]) -> str:
    """bench_l3.md: one row per store, size and strategy."""
    lines = [
        f"{result['model']} on {result['topology']}: {result['ranks']} x {result['device_name']}"
        f" (file store: OS page cache {result['page_cache']})",
        "",
        "| store | tokens | strategy | load ms | of which L3 ms | GB/s | x replicated "
        "| L3 read per rank | write-back ms | bit-exact |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in result["rows"]:
        reads = " / ".join(f"{b / 1e6:.1f} MB" for b in r["l3_read_bytes_per_rank"])
        lines.append(
            f"| {r['store']} | {r['tokens']} | {r['strategy']} | {r['ms']:.1f} "
            f"| {r['fetch_ms']:.1f} "
            f"| {r['gbps']:.2f} | {r['x_replicated']:.3f} | {reads} "
            f"| {r['write_back_ms']:.1f} | {'yes' if r['bit_exact'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
