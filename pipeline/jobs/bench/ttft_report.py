"""`bench bench=ttft`'s summary: one row per store, prefix, strategy and new-token count, the
slowest rank's medians, the overlapped run against max(load, compute), and the hit against
recomputing the prefix; as Markdown and as a PNG."""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Any

from pipeline.config.job import Job
from pipeline.config.links import links_of
from pipeline.jobs.bench.forward import published_config
from pipeline.jobs.bench.output import NO_PLOT, pyplot
from pipeline.jobs.cost_report import case_estimate
from pipeline.jobs.outputs import write_output

BAR = 1.10
"""The overlapped run should take at most this many times max(load, compute)."""


def summarize_ttft(ranks: list[dict], cases: list[tuple[Job, dict]], base: Job) -> dict[str, Any]:
    """Every case's rows from every rank's measurements; "ok": every row checked whole."""
    rows = []
    for i, (job, case) in enumerate(cases):
        per_rank = [r["cases"][i] for r in ranks]
        for j, new in enumerate(base.bench.new_tokens):
            rows.append(row_of(case, [c["rows"][j] for c in per_rank], new))
            rows[-1]["hits_ok"] = all(c["hits"] == c["pages"] for c in per_rank)
            rows[-1]["streamed"] = all(c["streamed"] for c in per_rank)
            rows[-1] |= estimate_of(job, case, rows[-1])
    config = published_config(base.model)
    return {
        "model": base.model.name,
        "topology": base.topology.name,
        "ranks": len(ranks),
        "device_name": ranks[0].get("device_name", "cpu") if ranks else "cpu",
        "forward": {
            "source": config.source,
            "heads_per_rank": config.heads_per_rank,
            "params_per_layer": [config.layer_params(i) for i in range(base.model.num_layers)],
        },
        "rows": rows,
        "ok": all(r["bit_exact"] for r in rows),
    }


def estimate_of(job: Job, case: dict, row: dict[str, Any]) -> dict[str, Any]:
    """The cost model's load of the case (`runtime.links`: the load from the host tier, or
    from L3) and the hit it predicts beside the measured compute (the model prices no
    forward): max(load, compute) where the forward uses each layer as it arrives (a host hit,
    a streamed load from L3), load + compute where its first layer waits for the last object
    (whole objects from L3); measured overlapped / that ("x_estimate")."""
    est = case_estimate(job, case["tokens"], False, links_of(job.runtime.links))
    leg = est.load if case["store"] == "none" else est.l3_load
    assert leg is not None, "an L3 case has a store"
    load_ms, compute_ms = leg.seconds * 1e3, row["compute_ms"]
    layerwise = case["store"] == "none" or row["streamed"]
    estimate_ms = max(load_ms, compute_ms) if layerwise else load_ms + compute_ms
    return {
        "load_estimate_ms": load_ms,
        "estimate_ms": estimate_ms,
        "x_estimate": row["overlapped_ms"] / estimate_ms,
    }


def row_of(case: dict, per_rank: list[dict], new: int) -> dict[str, Any]:
    """One row (see `summarize_ttft`), without the cost model's estimate."""

    def ms(key: str) -> float:
        return max(statistics.median(r[key]) for r in per_rank) * 1e3

    load, compute, overlapped, recompute = (
        ms(k) for k in ("load_s", "compute_s", "overlapped_s", "recompute_s")
    )
    ideal = max(load, compute)
    checked = ("bit_exact", "digests_match", "waits_per_layer")
    return {
        **case,
        "new_tokens": new,
        "load_ms": load,
        "compute_ms": compute,
        "serial_ms": ms("serial_s"),
        "overlapped_ms": overlapped,
        "ideal_ms": ideal,
        "x_ideal": overlapped / ideal,
        "within_bar": overlapped / ideal <= BAR,
        "recompute_ms": recompute,
        "hit_vs_recompute": recompute / overlapped,
        "hit_beats_recompute": overlapped < recompute,
        "flops": per_rank[0]["flops"],
        "issued_flops": per_rank[0]["issued_flops"],
        "recompute_flops": per_rank[0]["recompute_flops"],
        "compute_tflops": per_rank[0]["flops"] / compute / 1e9,
        "waits_per_layer": all(r["waits_per_layer"] for r in per_rank),
        "bit_exact": all(r[k] for r in per_rank for k in checked),
    }


def ttft_markdown(result: dict[str, Any]) -> str:
    """bench_ttft.md: one row per case and new-token count, then what was not measured."""
    forward = result["forward"]
    lines = [
        f"{result['model']} on {result['topology']}: {result['ranks']} x {result['device_name']}",
        f"forward: {forward['source']}; {forward['heads_per_rank']} heads and "
        f"{forward['params_per_layer'][-1] / 1e6:.1f} M params per layer on each rank",
        "",
        "| store | tokens | strategy | new tokens | load ms | compute ms | load then compute ms "
        "| overlapped ms | ideal ms | x ideal | recompute ms | hit vs recompute "
        "| load estimate ms | estimate ms | / estimate | TFLOP/s | waits per layer | bit-exact |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['store']} | {r['tokens']} | {r['strategy']} | {r['new_tokens']} "
            f"| {r['load_ms']:.1f} | {r['compute_ms']:.1f} | {r['serial_ms']:.1f} "
            f"| {r['overlapped_ms']:.1f} | {r['ideal_ms']:.1f} | {r['x_ideal']:.3f} "
            f"| {r['recompute_ms']:.1f} | {r['hit_vs_recompute']:.2f}x "
            f"| {r['load_estimate_ms']:.1f} | {r['estimate_ms']:.1f} | {r['x_estimate']:.2f} "
            f"| {r['compute_tflops']:.0f} "
            f"| {'yes' if r['waits_per_layer'] else 'NO'} "
            f"| {'yes' if r['bit_exact'] and r['hits_ok'] else 'NO'} |"
        )
    lines += [
        "",
        "x ideal: overlapped / max(load, compute); hit vs recompute: recompute / overlapped "
        "(above 1: the hit is faster); load estimate: the cost model's load with the links of "
        "runtime.links; estimate: max(load estimate, compute) for a host hit or a streamed "
        "load, load estimate + compute for whole objects from L3 (the model prices no forward); "
        "/ estimate: overlapped / estimate.",
    ]
    lines += [
        f"- not measured: {s['strategy']} ({s['store']}, {s['tokens']} tokens): "
        f"{'; '.join(s['inactive'])}"
        for s in result.get("skipped", [])
    ]
    return "\n".join(lines) + "\n"


def ttft_plot(result: dict[str, Any], path: Path) -> str:
    """Bars per row: overlapped, max(load, compute), load then compute, and recompute (log
    scale: a recompute can take a hundred times a hit); says why if it cannot."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    rows = result["rows"]
    labels = [
        f"{r['store']} {r['tokens'] // 1024}K +{r['new_tokens']}\n{r['strategy']}" for r in rows
    ]
    series = (
        ("overlapped_ms", "overlapped"),
        ("ideal_ms", "max(load, compute)"),
        ("serial_ms", "load then compute"),
        ("recompute_ms", "recompute"),
    )
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.8), 5))
    width = 0.8 / len(series)
    for k, (key, label) in enumerate(series):
        xs = [x + (k - 1.5) * width for x in range(len(rows))]
        ax.bar(xs, [r[key] for r in rows], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(list(range(len(rows))), labels, rotation=90, fontsize=7)
    ax.set_ylabel("median ms (slowest rank)")
    ax.set_title(
        f"time to first token, {result['model']}, {result['ranks']} x {result['device_name']}"
    )
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    write_output(path, png.getvalue())
    return str(path)
