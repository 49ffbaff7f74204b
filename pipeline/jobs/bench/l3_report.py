"""`bench bench=l3`'s summary: one row per store, page cache, size and strategy, against
replicated and against the limits the same run measured on the same objects."""

from __future__ import annotations

import statistics
from typing import Any

from pipeline.config.job import Job
from pipeline.config.links import links_of
from pipeline.jobs.cost_report import case_estimate


def limit_of(limits: dict[str, Any], case: dict, io_threads: int) -> float | None:
    """The read limit a row is held to: the warm or cold page-cache read at the tier's thread
    count (file), or the client's own loop (mooncake)."""
    if case["store"] == "mooncake":
        return limits["raw_gbps"]
    if case["io"] == "direct":
        return limits["direct_read_gbps"]
    warm = limits["warm_read_gbps"][str(io_threads)]
    if case["cache"] == "cold":  # a store the OS cannot drop (tmpfs) stays warm
        return limits["cold_read_gbps"] or warm
    return warm


def summarize_l3(ranks: list[dict], cases: list[tuple[Job, dict]], base: Job) -> dict[str, Any]:
    """One row per case: the slowest rank's median load, its ratio to replicated's, and its
    fraction of each limit ("x limit": of the store's read; "x ideal": of max(read at the
    limit, host -> device copy); "x read+copy": of a plain read into one buffer plus one copy
    of it; write-back "x write": of writing the same files plainly)."""
    rows = [
        row_of(job, case, [r["cases"][i] for r in ranks]) for i, (job, case) in enumerate(cases)
    ]
    for row in rows:
        reference = next(
            r
            for r in rows
            if (r["store"], r["cache"], r["io"], r["tokens"], r["strategy"])
            == (row["store"], row["cache"], row["io"], row["tokens"], "replicated")
        )
        row["x_replicated"] = reference["ms"] / row["ms"]
    return {
        "model": base.model.name,
        "topology": base.topology.name,
        "ranks": len(ranks),
        "device_name": ranks[0].get("device_name", "cpu"),
        "rows": rows,
    }


def row_of(job: Job, case: dict, per_rank: list[dict]) -> dict[str, Any]:
    """One case's row from every rank's measurements (see `summarize_l3`)."""
    limits = next(c["limits"] for c in per_rank if c["limits"])
    unique = case["tokens"] * job.model.bytes_per_token
    seconds = max(statistics.median(c["load_s"]) for c in per_rank)
    write_s = max(c["write_back_s"] for c in per_rank)
    gbps = unique / seconds / 1e9
    limit = limit_of(limits, case, job.storage.io_threads)
    est = case_estimate(job, case["tokens"], False, links_of(job.runtime.links)).l3_load
    assert est is not None, "an L3 case has a store"
    return {
        "estimate_ms": est.seconds * 1e3,
        "x_estimate": seconds / est.seconds,
        **case,
        "ms": seconds * 1e3,
        "fetch_ms": max(statistics.median(c["fetch_s"]) for c in per_rank) * 1e3,
        "write_back_ms": write_s * 1e3,
        "gbps": gbps,
        "limit_gbps": limit,
        "x_limit": gbps / limit if limit else None,
        "x_ideal": max(1 / limit, 1 / limits["h2d_gbps"]) * gbps if limit else None,
        "x_read_copy": gbps / limits["read_copy_gbps"] if "read_copy_gbps" in limits else None,
        "x_write": unique / write_s / 1e9 / limits["write_gbps"]
        if "write_gbps" in limits
        else None,
        "l3_read_bytes_per_rank": [c["l3_read_bytes_per_load"] for c in per_rank],
        "fallbacks": sum(c["fallbacks"] for c in per_rank),
        "bit_exact": all(c["bit_exact"] for c in per_rank),
        "unique_bytes": unique,
        "limits": limits,
        "io_threads": job.storage.io_threads,
        "load_chunk_pages": per_rank[0]["window_pages"],
        "stream_layers": per_rank[0]["stream_layers"],
        "layout": job.topology.mem_layout.value,
    }


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def l3_markdown(result: dict[str, Any]) -> str:
    """bench_l3.md: the loads, one row per case (beside each, the cost model's estimate with
    the links of `runtime.links`, and measured / estimate), then the limits measured on each
    case's objects."""
    lines = [
        f"{result['model']} on {result['topology']}: {result['ranks']} x {result['device_name']}",
        "",
        "| store | cache | io | tokens | layout | strategy | load ms | estimate ms "
        "| / estimate | of which L3 ms | GB/s "
        "| x limit | x ideal | x read+copy | x replicated | L3 read per rank | write-back ms "
        "| x write | bit-exact |",
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in result["rows"]:
        reads = " / ".join(f"{b / 1e6:.1f} MB" for b in r["l3_read_bytes_per_rank"])
        lines.append(
            f"| {r['store']} | {r['cache']} | {r['io']} | {r['tokens']} | {r['layout']} "
            f"| {r['strategy']} "
            f"| {r['ms']:.1f} | {r['estimate_ms']:.1f} | {r['x_estimate']:.2f} "
            f"| {r['fetch_ms']:.1f} | {r['gbps']:.2f} | {_x(r['x_limit'])} "
            f"| {_x(r['x_ideal'])} | {_x(r['x_read_copy'])} | {r['x_replicated']:.3f} "
            f"| {reads} | {r['write_back_ms']:.1f} | {_x(r['x_write'])} "
            f"| {'yes' if r['bit_exact'] else 'NO'} |"
        )
    lines += limits_markdown(result["rows"])
    lines += ["", *result.get("notes", [])]
    return "\n".join(lines) + "\n"


def limits_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The limits table: what the machine did with each case's objects."""
    lines = ["", "Limits measured in the same run on each case's objects (GB/s):", ""]
    lines += [
        "| store | cache | io | tokens | strategy | read 1 / io / all threads | cold read "
        "| O_DIRECT read | to device "
        "| read+copy | ranged (every other unit) | whole | write | CRC-32C | Mooncake raw "
        "| Mooncake raw, whole objects |",
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    for r in rows:
        lim = r["limits"]
        warm = " / ".join(f"{g:.2f}" for g in lim.get("warm_read_gbps", {}).values()) or "-"
        cold = lim.get("cold_note") or _x(lim.get("cold_read_gbps"))
        whole = lim["bytes"] / lim["whole_s"] / 1e9 if "whole_s" in lim else None
        cells = [
            r["store"],
            r["cache"],
            r["io"],
            str(r["tokens"]),
            r["strategy"],
            warm,
            cold,
            *(
                _x(v)
                for v in (
                    lim.get("direct_read_gbps"),
                    lim.get("h2d_gbps"),
                    lim.get("read_copy_gbps"),
                    lim.get("ranged_gbps"),
                    whole,
                    lim.get("write_gbps"),
                    lim.get("digest_gbps"),
                    lim.get("raw_gbps"),
                    lim.get("raw_whole_gbps"),
                )
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
