"""bench output: a Markdown table and a PNG bar chart of the summarized rows."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from pipeline.config.job import Job
from pipeline.core.cost import Links
from pipeline.jobs.cost_report import case_estimate
from pipeline.jobs.outputs import write_output


def graphs(row: dict[str, Any]) -> str:
    """Whether the case replayed CUDA graphs (only the kernel backend on cuda can)."""
    return "yes" if row["graphed"] else "-" if row["io"] != "kernel" else "no"


def ops_text(ops: dict[str, int]) -> str:
    """Op counts of one transfer, e.g. '16 batch_gather + 16 copy'."""
    return " + ".join(f"{n} {kind}" for kind, n in sorted(ops.items()))


def with_estimates(result: dict[str, Any], runnable: list[tuple[Job, dict]], links: Links) -> None:
    """Each row's cost-model estimate (`estimate_ms`) and measured / estimate (`x_estimate`),
    from the case's own job (`summarize` makes a backup and a load row per case, in order)."""
    for i, (job, case) in enumerate(runnable):
        e = case_estimate(job, case["tokens"], case["placement"] == "fragmented", links)
        for row, leg in zip(result["rows"][2 * i : 2 * i + 2], (e.backup, e.load), strict=True):
            row["estimate_ms"] = leg.seconds * 1e3
            row["x_estimate"] = row["ms"] / row["estimate_ms"]
    result["links"] = links.machine


def _estimate(row: dict[str, Any]) -> str:
    if "estimate_ms" not in row:
        return "- | -"
    return f"{row['estimate_ms']:.2f} | {row['x_estimate']:.2f}"


def markdown(result: dict[str, Any]) -> str:
    """bench.md: the floors, every case (with the cost model's estimate where
    `with_estimates` added it: links of `runtime.links`), and the chunked backups timed in
    turn."""
    lines = [
        f"{result['model']} on {result['topology']}: {result['ranks']} x {result['device_name']}",
        *([f"estimates priced with the `{result['links']}` links"] if "links" in result else []),
        "",
        *_floors(result["floors"]),
        "",
        "| direction | placement | tokens | io | graphs | chunk | strategy | ms | estimate ms "
        "| / estimate | GB/s per rank "
        "| x floor | hand loop ms | x hand loop | issue ms | best issue ms | hand loop issue ms "
        "| bit-exact |",
        "| --- | --- | ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for r in result["rows"]:
        exact = "yes" if r["bit_exact"] and r["reference_bit_exact"] else "NO"
        lines.append(
            f"| {r['direction']} | {r['placement']} | {r['tokens']} | {r['io']} "
            f"| {graphs(r)} | {r['chunk_pages']} | {r['strategy']} | {r['ms']:.2f} "
            f"| {_estimate(r)} | {r['gbps_per_rank']:.1f} | {r['x_floor']:.3f} "
            f"| {r['reference_ms']:.2f} | {r['x_reference']:.3f} | {r['issue_ms']:.2f} "
            f"| {r['best_issue_ms']:.2f} | {r['reference_issue_ms']:.2f} | {exact} |"
        )
    lines += _in_turn([r for r in result["rows"] if "x_unchunked" in r])
    lines += [
        f"- skipped {s['strategy']} ({s['io']}, {s['placement']}): {s['inactive']}"
        for s in result.get("skipped", [])
    ]
    return "\n".join(lines) + "\n"


def _floors(f: dict[str, Any]) -> list[str]:
    def gbps(xs: list[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in xs)

    lines = [
        "| floor | GB/s per rank |",
        "| --- | --- |",
        f"| pinned H2D, one GPU at a time | {gbps(f['h2d_alone_gbps'])} |",
        f"| pinned H2D, all GPUs at once | {gbps(f['h2d_all_gbps'])} |",
        f"| pinned D2H, one GPU at a time | {gbps(f['d2h_alone_gbps'])} |",
        f"| pinned D2H, all GPUs at once | {gbps(f['d2h_all_gbps'])} |",
    ]
    if f["broadcast_gbps"]:
        lines.append(f"| broadcast (algorithm bandwidth) | {f['broadcast_gbps']:.1f} |")
    return lines


def _in_turn(chunked: list[dict[str, Any]]) -> list[str]:
    """The chunked backups against the same backups unchunked, with each side's ops."""
    if not chunked:
        return []
    return [
        "",
        "Chunked backups against the same backup unchunked, timed in turn in one case:",
        "",
        "| placement | tokens | io | graphs | chunk | strategy | ms | unchunked ms "
        "| chunked / unchunked | chunked ops (rank 0) | unchunked ops (rank 0) |",
        "| --- | ---: | --- | --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
        *(
            f"| {r['placement']} | {r['tokens']} | {r['io']} | {graphs(r)} | {r['chunk_pages']} "
            f"| {r['strategy']} | {r['ms']:.2f} | {r['unchunked_ms']:.2f} "
            f"| {r['x_unchunked']:.3f} | {ops_text(r['ops'][0])} "
            f"| {ops_text(r['unchunked_ops'][0])} |"
            for r in chunked
        ),
    ]


NO_PLOT = 'no PNG: matplotlib is not installed (pip install -e ".[plot]")'


def pyplot() -> Any | None:
    """matplotlib's pyplot drawing to files (Agg), or None where the plot extra is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot(result: dict[str, Any], path: Path) -> str:
    """Bars of median ms per case, framework next to the hand loop; says why if it cannot."""
    plt = pyplot()
    if plt is None:
        return NO_PLOT
    rows = result["rows"]
    labels = [
        f"{r['direction']} {r['placement'][:4]} {r['tokens'] // 1024}K {r['io'][:3]} "
        f"c{r['chunk_pages']}{' g' if graphs(r) == 'yes' else ''}\n"
        f"{r['strategy']}"
        for r in rows
    ]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.55), 5))
    ax.bar([x - 0.2 for x in xs], [r["ms"] for r in rows], 0.4, label="hicache-pipeline")
    ax.bar([x + 0.2 for x in xs], [r["reference_ms"] for r in rows], 0.4, label="hand loop")
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_ylabel("median ms (slowest rank)")
    ax.set_title(f"{result['model']}, {result['ranks']} x {result['device_name']}")
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    write_output(path, png.getvalue())
    return str(path)
