"""Writes BENCHMARKS.md's result tables, and README's, from the result files under
docs/benchmarks/results/ (one folder per run, each with a result.json; the schema is in
docs/benchmarks/results/README.md).

    python docs/tools/results_tables.py            # rewrite every generated block
    python docs/tools/results_tables.py --check    # exit 1, with a diff, if one is stale

A block lies between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`. README's rows
are the picks of docs/benchmarks/readme_results.json. A result is stale where
`git diff -M --name-status <its commit>` (against the working tree) names a file under one of
its paths, pure renames (R100) aside.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from generated import write_or_check  # beside this file

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs/benchmarks/results"
README_PICKS = ROOT / "docs/benchmarks/readme_results.json"
GENERATOR = "docs/tools/results_tables.py"
CASE = ("tokens", "direction", "placement", "io", "graphs", "chunk")
Row = dict[str, Any]


def load(folder: str) -> dict[str, Any]:
    """A result file, its rows computed from its raw bench JSON where it names some."""
    result = json.loads((RESULTS / folder / "result.json").read_text())
    result["folder"] = folder
    if "raw" in result:
        result["rows"] = raw_rows([RESULTS / folder / name for name in result["raw"]])
    if "raw_l3" in result:
        result["rows"] = l3_rows([RESULTS / folder / name for name in result["raw_l3"]])
    result["stale"] = stale(result["commit"], result["paths"])
    return result


def raw_rows(paths: list[Path]) -> list[Row]:
    """One row per case of `bench` JSON: the mean of the runs' issue ms, GPU ms and x floor."""
    runs = [json.loads(p.read_text())["rows"] for p in paths]
    rows = []
    for same in zip(*runs, strict=True):
        first = same[0]
        graphs = "yes" if first["cuda_graph_cache"] else "-" if first["io"] == "direct" else "no"
        row = {k: first[k] for k in ("tokens", "direction", "placement", "io")}
        row |= {"graphs": graphs, "chunk": first["chunk_pages"]}
        row |= {k: statistics.mean(r[k] for r in same) for k in ("issue_ms", "ms", "x_floor")}
        row["copy_calls"] = " + ".join(f"{n} {op}" for op, n in first["ops"][0].items())
        row["bit_exact"] = all(r["bit_exact"] and r["reference_bit_exact"] for r in same)
        rows.append(row)
    return rows


def l3_rows(paths: list[Path]) -> list[Row]:
    """One row per case of each `bench bench=l3` JSON, as the l3 table names its fields."""
    rows = []
    for path in paths:
        for r in json.loads(path.read_text())["rows"]:
            row = {k: r[k] for k in ("store", "cache", "io", "io_threads", "tokens", "gbps")}
            row |= {"load_ms": r["ms"], "x_limit": r["x_limit"], "limit": "read"}
            rows.append(row | {"stream_layers": r["stream_layers"]})
    return rows


@functools.cache
def changed_since(commit: str) -> tuple[str, ...] | None:
    """Every path changed since `commit` (both names of a renamed file, pure renames aside);
    None where git or the commit is not at hand. Once per commit: several results share one."""
    try:
        diff = ["git", "diff", "-M", "--name-status", commit]
        out = subprocess.run(diff, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return tuple(
        name
        for line in out.splitlines()
        if not line.startswith("R100\t")
        for name in line.split("\t")[1:]
    )


def stale(commit: str, paths: list[str]) -> str:
    """'stale' where a file under `paths` changed since `commit` (pure renames aside),
    'current' where none did, 'unknown' where git or the commit is not at hand."""
    changed = changed_since(commit)
    if changed is None:
        return "unknown"
    return "stale" if any(name.startswith(tuple(paths)) for name in changed) else "current"


def commit_cell(result: dict[str, Any]) -> str:
    flag = result["stale"]
    return result["commit"] + ("" if flag == "current" else f" ({flag})")


def table(header: list[str], rows: list[list[Any]]) -> str:
    def text(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(text, row)) + " |" for row in rows]
    return "\n".join(lines)


def with_runs(rows_table: str, results: list[dict[str, Any]]) -> str:
    """The rows, then where, when and how each result was measured and where it comes from."""
    header = ["commit", "date", "hardware", "software", "command", "source"]
    rows = []
    for r in results:
        command, source = f"`{r['command']}`", f"`{r['folder']}/`: {r['source']}"
        rows.append([commit_cell(r), r["date"], r["hardware"], r["software"], command, source])
    return rows_table + "\n\n" + table(header, rows)


def ratio(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tp2_matrix() -> str:
    """One row per case, the three strategies side by side."""
    result = load("2026-11-30-h200x2-tp2-matrix")
    strategies = ("replicated", "single_source", "rotating")
    cases: dict[tuple, dict[str, Row]] = {}
    for row in result["rows"]:
        cases.setdefault(tuple(row[k] for k in CASE), {})[row["strategy"]] = row
    header = ["commit", *CASE, *(f"{s} ms (x limit)" for s in strategies), "bit-exact"]
    rows = []
    for key, by in cases.items():
        cells = [f"{by[s]['ms']:.2f} ({ratio(by[s]['x_floor'])})" for s in strategies]
        exact = "yes" if all(by[s]["bit_exact"] == "yes" for s in strategies) else "NO"
        rows.append([commit_cell(result), *key, *cells, exact])
    return with_runs(table(header, rows), [result])


def issue_time() -> str:
    """One row per case, the two trees (two hosts) side by side: 'first / second'."""
    results = [load("2026-12-05-h200-issue-time"), load("2026-12-05-h200-after-issue-49")]
    header = ["commit", *CASE, "issue ms", "GPU ms", "x limit", "copy calls", "bit-exact"]
    commits = " / ".join(map(commit_cell, results))
    rows = []
    for same in zip(*(r["rows"] for r in results), strict=True):
        case = [same[0][k] for k in CASE]
        assert all([r[k] for k in CASE] == case for r in same)
        figures = [" / ".join(f"{r[k]:.2f}" for r in same) for k in ("issue_ms", "ms")]
        figures.append(" / ".join(ratio(r["x_floor"]) for r in same))
        calls = " / ".join(dict.fromkeys(r["copy_calls"] for r in same))
        exact = "yes" if all(r["bit_exact"] for r in same) else "NO"
        rows.append([commits, *case, *figures, calls, exact])
    return with_runs(table(header, rows), results)


def ttft() -> str:
    # the latest run (16K and 64K, on an H100), then the latest on an H200 (16K)
    results = [
        load("2026-12-07-h100-mooncake-sums-ttft"),
        load("2026-12-07-h200-write-buffers-ttft"),
    ]
    names = ["store", "tokens", "new_tokens", "stream_layers", "load_ms", "compute_ms"]
    header = ["commit", "store", "cached tokens", "new tokens", "stream_layers", "load ms"]
    header += ["compute ms", "overlapped ms", "x limit", "recompute ms", "hit vs recompute"]
    rows = []
    for result in results:
        for r in result["rows"]:
            figures = [r["overlapped_ms"], ratio(r["x_ideal"]), r["recompute_ms"]]
            hit = f"{r['hit_vs_recompute']:.2f}x"
            rows.append([commit_cell(result), *(r[n] for n in names), *figures, hit])
    return with_runs(table(header, rows), results)


def vllm_ttft() -> str:
    """A real vllm.LLM: the store's hit in a fresh engine against computing the prompt."""
    result = load("2026-12-06-h100-vllm026-connector")
    header = ["commit", "prompt", "tokens", "cached tokens", "computed ms", "loaded ms"]
    header += ["loaded vs computed", "same token"]
    names = ["prompt", "prompt_tokens", "cached_tokens", "computed_ms", "loaded_ms"]
    names += ["loaded_vs_computed", "same_token"]
    rows = [[commit_cell(result), *(r[n] for n in names)] for r in result["rows"]]
    return with_runs(table(header, rows), [result])


def l3_limits() -> str:
    folders = ["2026-12-07-h100-window-futures-l3", "2026-12-07-h100-mooncake-sums-l3"]
    folders += ["2026-12-07-h200-write-buffers-l3"]
    folders += ["2026-12-07-cpu-block-copies"]
    results = [load(f) for f in folders]
    names = ["store", "cache", "io", "io_threads", "tokens", "load_ms", "gbps"]
    header = ["commit", "hardware", "store", "cache", "io", "I/O threads", "tokens", "load ms"]
    header += ["GB/s", "x limit", "limit", "layers a read"]
    rows = []
    for result in results:
        for r in result["rows"]:
            cells = [*(r[n] for n in names), ratio(r["x_limit"], 2), r["limit"]]
            cells.append(r.get("stream_layers") or "all")
            rows.append([commit_cell(result), short(result["hardware"]), *cells])
    return with_runs(table(header, rows), results)


def short(hardware: str) -> str:
    """'1x NVIDIA H200 (nvidia-h200, 16 cores), ...' -> '1x NVIDIA H200'."""
    return re.split(r",| \(", hardware)[0]


COST_GROUPS = {
    "tp2 923a77f": "2026-11-30-h200x2-tp2-matrix",
    "tp1 161883b": "2026-12-02-h200-tp1-161883b",
    "tp1 b017ae9": "2026-12-02-h200-tp1-b017ae9-small",
    "tp1 2f722f2 L3": "2026-12-01-h200-l3-read",
}
"""The estimates' `where` of each measured result."""
SMALL_TOKENS = 512


def cost_model() -> str:
    """Per measured result: how many of its rows the cost model's estimate meets within 25%."""
    estimates = load("2026-12-05-cost-model-h200")
    header = ["commit", "measured rows", "above 512 tokens: within 25%", "mean abs error"]
    header += ["largest error", "512 tokens or fewer: within 25%", "TP2: pick = fastest"]
    rows = []
    measured = [load(f) for f in COST_GROUPS.values()]
    for where, result in zip(COST_GROUPS, measured, strict=True):
        group = [r for r in estimates["rows"] if r["where"] == where]
        big = [error(r) for r in group if r["tokens"] > SMALL_TOKENS]
        small = [error(r) for r in group if r["tokens"] <= SMALL_TOKENS]
        rows.append(
            [
                commit_cell(result),
                len(group),
                f"{sum(abs(e) <= 0.25 for e in big)} of {len(big)}",
                f"{statistics.mean(abs(e) for e in big):.1%}",
                f"{max(big, key=abs):+.1%}",
                f"{sum(abs(e) <= 0.25 for e in small)} of {len(small)}" if small else "-",
                picks(group) if where.startswith("tp2") else "-",
            ]
        )
    return with_runs(table(header, rows), [*measured, estimates])


def error(row: Row) -> float:
    return row["estimate_ms"] / row["measured_ms"] - 1


def picks(group: list[Row]) -> str:
    """In how many settings the strategy of least estimate is the one measured fastest."""
    settings: dict[tuple, list[Row]] = {}
    for r in group:
        settings.setdefault(tuple(r[k] for k in CASE), []).append(r)

    def best(rows: list[Row], field: str) -> str:
        return min(rows, key=lambda r: r[field])["strategy"]

    same = sum(best(rows, "estimate_ms") == best(rows, "measured_ms") for rows in settings.values())
    return f"{same} of {len(settings)}"


def readme() -> str:
    """One row per pick: what, the figure, its x limit, hardware, commit and date."""
    rows = []
    for pick in json.loads(README_PICKS.read_text()):
        result = load(pick["folder"])
        found = [r for r in result["rows"] if pick["where"].items() <= r.items()]
        assert len(found) == 1, (pick, len(found))
        figure = f"{found[0][pick['figure']]:.2f} ms"
        limit = f"{ratio(found[0][pick['limit']])} {pick['of']}"
        hardware = short(result["hardware"])
        rows.append([pick["what"], figure, limit, hardware, commit_cell(result), result["date"]])
    return table(["what", "figure", "x limit", "hardware", "commit", "date"], rows)


Blocks = dict[str, Callable[[], str]]
BENCHMARKS_BLOCKS: Blocks = {
    "tp2-matrix": tp2_matrix,
    "issue-time": issue_time,
    "ttft": ttft,
    "vllm-ttft": vllm_ttft,
    "l3-limits": l3_limits,
    "cost-model": cost_model,
}
README_BLOCKS: Blocks = {"readme-results": readme}


def fill(text: str, blocks: Blocks) -> str:
    """`text` with each named block's body replaced by what its function writes now."""
    for name, make in blocks.items():
        start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{start}\n{make()}\n{end}{tail}"
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a block is stale")
    check = parser.parse_args(argv).check
    stale_files = 0
    for name, blocks in (("BENCHMARKS.md", BENCHMARKS_BLOCKS), ("README.md", README_BLOCKS)):
        old = (ROOT / name).read_text()
        first = f"<!-- generated:{next(iter(blocks))} -->"
        if first not in old:
            print(f"{name}: no {first} block, skipped")
            continue
        stale_files += write_or_check(ROOT / name, fill(old, blocks), GENERATOR, check)
    return 1 if stale_files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
