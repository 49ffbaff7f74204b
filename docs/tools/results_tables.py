"""Writes BENCHMARKS.md's result tables, and README's, from the result files under
docs/benchmarks/results/ (one folder per run, each with a result.json; the schema is in
BENCHMARKS.md, "How to read and reproduce").

    python docs/tools/results_tables.py            # rewrite every generated block
    python docs/tools/results_tables.py --check    # exit 1, with a diff, if one is stale

A block lies between `<!-- generated:NAME -->` and `<!-- /generated:NAME -->`. A result is
stale where `git diff -M --name-status <its commit>` (against the working tree) names a file
under one of its paths, pure renames (R100) aside.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs/benchmarks/results"
Row = dict[str, object]
Result = dict[str, object]


def load(folder: str) -> Result:
    """A result file, its rows computed from its raw bench JSON where it names some."""
    result: Result = json.loads((RESULTS / folder / "result.json").read_text())
    result["folder"] = folder
    if "raw" in result:
        result["rows"] = raw_rows([RESULTS / folder / str(n) for n in as_list(result["raw"])])
    result["stale"] = stale(result)
    return result


def as_list(value: object) -> list:
    assert isinstance(value, list)
    return value


def raw_rows(paths: list[Path]) -> list[Row]:
    """One row per case: the mean of the runs' issue ms, GPU ms and x floor."""
    runs = [json.loads(p.read_text())["rows"] for p in paths]
    rows = []
    for same in zip(*runs, strict=True):
        first = same[0]
        graphs = "yes" if first["cuda_graph_cache"] else "-" if first["io"] == "direct" else "no"
        rows.append(
            {
                "tokens": first["tokens"],
                "direction": first["direction"],
                "placement": first["placement"],
                "io": first["io"],
                "graphs": graphs,
                "chunk": first["chunk_pages"],
                "issue_ms": statistics.mean(r["issue_ms"] for r in same),
                "ms": statistics.mean(r["ms"] for r in same),
                "x_floor": statistics.mean(r["x_floor"] for r in same),
                "copy_calls": " + ".join(f"{n} {op}" for op, n in first["ops"][0].items()),
                "bit_exact": all(r["bit_exact"] and r["reference_bit_exact"] for r in same),
            }
        )
    return rows


def changed_paths(commit: str) -> list[str] | None:
    """Paths changed since `commit` in the working tree, pure renames left out; None where
    git or the commit is not at hand."""
    try:
        out = subprocess.run(
            ["git", "diff", "-M", "--name-status", commit],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = []
    for line in out.splitlines():
        status, *names = line.split("\t")
        if status != "R100":
            paths += names
    return paths


def stale(result: Result) -> str:
    """'stale', 'current' or 'unknown' for the code on the result's paths."""
    changed = changed_paths(str(result["commit"]))
    if changed is None:
        return "unknown"
    prefixes = tuple(as_list(result["paths"]))
    return "stale" if any(p.startswith(prefixes) for p in changed) else "current"


def commit_cell(result: Result) -> str:
    flag = result["stale"]
    return str(result["commit"]) + ("" if flag == "current" else f" ({flag})")


def table(header: list[str], rows: list[list[object]]) -> str:
    def text(x: object) -> str:
        return f"{x:.2f}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(map(text, row)) + " |" for row in rows]
    return "\n".join(lines)


def runs(results: list[Result]) -> str:
    """Where, when and how each result was measured, and where its figures come from."""
    header = ["commit", "date", "hardware", "software", "command", "source"]
    rows: list[list[object]] = []
    for r in results:
        source = f"`{r['folder']}/`: {r['source']}"
        command = f"`{r['command']}`"
        rows.append([commit_cell(r), r["date"], r["hardware"], r["software"], command, source])
    return table(header, rows)


def x(value: object, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def tp2_matrix() -> str:
    result = load("2026-11-30-h200x2-tp2-matrix")
    strategies = ("replicated", "single_source", "rotating")
    cases: dict[tuple, dict[str, Row]] = {}
    for row in as_list(result["rows"]):
        key = tuple(row[k] for k in ("tokens", "direction", "placement", "io", "graphs", "chunk"))
        cases.setdefault(key, {})[row["strategy"]] = row
    header = ["commit", "tokens", "direction", "placement", "io", "graphs", "chunk"]
    header += [f"{s} ms (x limit)" for s in strategies] + ["bit-exact"]
    rows: list[list[object]] = []
    for key, by in cases.items():
        cells = [f"{by[s]['ms']:.2f} ({x(by[s]['x_floor'])})" for s in strategies]
        exact = "yes" if all(by[s]["bit_exact"] == "yes" for s in strategies) else "NO"
        rows.append([commit_cell(result), *key, *cells, exact])
    return table(header, rows) + "\n\n" + runs([result])


def issue_time() -> str:
    """One row per case, the two trees (two hosts) side by side: 'first / second'."""
    results = [load("2026-12-05-h200-issue-time"), load("2026-12-05-h200-after-issue-49")]
    header = ["commit", "tokens", "direction", "placement", "io", "graphs", "chunk"]
    header += ["issue ms", "GPU ms", "x limit", "copy calls", "bit-exact"]
    commits = " / ".join(map(commit_cell, results))
    rows: list[list[object]] = []
    for same in zip(*(as_list(r["rows"]) for r in results), strict=True):
        case = [same[0][k] for k in ("tokens", "direction", "placement", "io", "graphs", "chunk")]
        assert all(
            [r[k] for k in ("tokens", "direction", "placement", "io")] == case[:4] for r in same
        )
        figures = [" / ".join(f"{r[k]:.2f}" for r in same) for k in ("issue_ms", "ms")]
        figures.append(" / ".join(x(r["x_floor"]) for r in same))
        calls = " / ".join(dict.fromkeys(str(r["copy_calls"]) for r in same))
        exact = "yes" if all(r["bit_exact"] for r in same) else "NO"
        rows.append([commits, *case, *figures, calls, exact])
    return table(header, rows) + "\n\n" + runs(results)


def ttft() -> str:
    results = [load("2026-12-02-h200-ttft-host"), load("2026-12-03-h200-ttft-l3")]
    names = ["store", "tokens", "new_tokens", "stream_layers", "load_ms", "compute_ms"]
    names += ["overlapped_ms", "x_ideal", "recompute_ms", "hit_vs_recompute"]
    header = ["commit", "store", "cached tokens", "new tokens", "stream_layers", "load ms"]
    header += ["compute ms", "overlapped ms", "x limit", "recompute ms", "hit vs recompute"]
    rows: list[list[object]] = []
    for result in results:
        for r in as_list(result["rows"]):
            cells = [r[n] for n in names]
            cells[7] = x(cells[7])
            cells[9] = f"{cells[9]:.2f}x"
            rows.append([commit_cell(result), *cells])
    return table(header, rows) + "\n\n" + runs(results)


def l3_limits() -> str:
    folders = ["2026-12-01-h200-l3-read", "2026-12-01-h200-l3-cold", "2026-12-01-cpu-l3-read"]
    results = [load(f) for f in folders]
    header = ["commit", "hardware", "store", "cache", "io", "I/O threads", "tokens", "load ms"]
    header += ["GB/s", "x limit", "limit"]
    rows: list[list[object]] = []
    for result in results:
        hardware = short(str(result["hardware"]))
        for r in as_list(result["rows"]):
            cells = [r[n] for n in ("store", "cache", "io", "io_threads", "tokens", "load_ms")]
            cells += [r["gbps"], x(r["x_limit"], 2), r["limit"]]
            rows.append([commit_cell(result), hardware, *cells])
    return table(header, rows) + "\n\n" + runs(results)


def short(hardware: str) -> str:
    """'1x NVIDIA H200 (nvidia-h200, 16 cores), ...' -> '1x NVIDIA H200'."""
    return re.split(r",| \(", hardware)[0]


COST_GROUPS = {
    "tp2 923a77f": "2026-11-30-h200x2-tp2-matrix",
    "tp1 161883b": "2026-12-02-h200-tp1-161883b",
    "tp1 b017ae9": "2026-12-02-h200-tp1-b017ae9-small",
    "tp1 2f722f2 L3": "2026-12-01-h200-l3-read",
}
SMALL_TOKENS = 512


def cost_model() -> str:
    """Per measured set: how many rows the cost model's estimate meets within 25%."""
    estimates = load("2026-12-05-cost-model-h200")
    header = ["commit", "measured rows", "above 512 tokens: within 25%", "mean abs error"]
    header += ["largest error", "512 tokens or fewer: within 25%", "TP2: pick = fastest"]
    rows: list[list[object]] = []
    measured = [load(f) for f in COST_GROUPS.values()]
    for where, result in zip(COST_GROUPS, measured, strict=True):
        group = [r for r in as_list(estimates["rows"]) if r["where"] == where]
        big = [r["estimate_ms"] / r["measured_ms"] - 1 for r in group if r["tokens"] > SMALL_TOKENS]
        small = [
            r["estimate_ms"] / r["measured_ms"] - 1 for r in group if r["tokens"] <= SMALL_TOKENS
        ]
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
    return table(header, rows) + "\n\n" + runs([*measured, estimates])


def picks(group: list[Row]) -> str:
    """In how many settings the strategy of least estimate is the one measured fastest."""
    settings: dict[tuple, list[Row]] = {}
    for r in group:
        key = tuple(r[k] for k in ("direction", "placement", "tokens", "io", "graphs", "chunk"))
        settings.setdefault(key, []).append(r)

    def best(rows: list[Row], field: str) -> object:
        return min(rows, key=lambda r: float(str(r[field])))["strategy"]

    same = sum(best(rows, "estimate_ms") == best(rows, "measured_ms") for rows in settings.values())
    return f"{same} of {len(settings)}"


class Pick(NamedTuple):
    """One README row: a result's row, the field shown and the limit it is measured against."""

    what: str
    folder: str
    where: dict[str, object]
    figure: str
    limit: str
    of: str


FLOOR, IDEAL = "of the host-path floor", "of max(load, compute)"
TP2 = "2026-11-30-h200x2-tp2-matrix"
LOAD_16K: dict[str, object] = {"tokens": 16384, "direction": "load", "io": "direct", "chunk": 0}
README = [
    Pick(
        "TP2 load-back, 16K tokens, rotating, contiguous, direct",
        TP2,
        LOAD_16K | {"strategy": "rotating"},
        "ms",
        "x_floor",
        FLOOR,
    ),
    Pick(
        "TP2 load-back, 64K tokens, rotating, contiguous, direct",
        TP2,
        LOAD_16K | {"tokens": 65536, "strategy": "rotating"},
        "ms",
        "x_floor",
        FLOOR,
    ),
    Pick(
        "TP2 load-back, 16K tokens, replicated (ceiling 0.5)",
        TP2,
        LOAD_16K | {"strategy": "replicated"},
        "ms",
        "x_floor",
        FLOOR,
    ),
    Pick(
        "One GPU: host time to issue a 16K load, direct",
        "2026-12-05-h200-issue-time",
        LOAD_16K,
        "issue_ms",
        "x_floor",
        "of the floor (GPU time)",
    ),
    Pick(
        "Prefix hit from host memory, 16K cached + 1K new tokens",
        "2026-12-02-h200-ttft-host",
        {"tokens": 16384, "new_tokens": 1024},
        "overlapped_ms",
        "x_ideal",
        IDEAL,
    ),
    Pick(
        "Prefix hit from the file store, 16K cached + 1K new tokens",
        "2026-12-03-h200-ttft-l3",
        {"tokens": 16384, "new_tokens": 1024, "store": "file", "stream_layers": 0},
        "overlapped_ms",
        "x_ideal",
        IDEAL,
    ),
    Pick(
        "Load from the file store, 16K tokens, 4 I/O threads, warm",
        "2026-12-01-h200-l3-read",
        {"tokens": 16384, "store": "file", "io_threads": 4},
        "load_ms",
        "x_limit",
        "of the page-cache read",
    ),
]
"""README's results: at most 8 rows, one result with its conditions each."""


def readme() -> str:
    rows: list[list[object]] = []
    for pick in README:
        result = load(pick.folder)
        row = one(result, pick.where)
        figure, limit = f"{row[pick.figure]:.2f} ms", f"{x(row[pick.limit])} {pick.of}"
        hardware = short(str(result["hardware"]))
        rows.append([pick.what, figure, limit, hardware, commit_cell(result), result["date"]])
    return table(["what", "figure", "x limit", "hardware", "commit", "date"], rows)


def one(result: Result, where: dict[str, object]) -> Row:
    found = [r for r in as_list(result["rows"]) if all(r[k] == v for k, v in where.items())]
    assert len(found) == 1, (result["folder"], where, len(found))
    return found[0]


BLOCKS: dict[str, Callable[[], str]] = {
    "tp2-matrix": tp2_matrix,
    "issue-time": issue_time,
    "ttft": ttft,
    "l3-limits": l3_limits,
    "cost-model": cost_model,
}


def fill(text: str, blocks: dict[str, Callable[[], str]]) -> str:
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
    stale_files = []
    for path, blocks in (
        (ROOT / "BENCHMARKS.md", BLOCKS),
        (ROOT / "README.md", {"readme-results": readme}),
    ):
        old = path.read_text()
        if "<!-- generated:" + next(iter(blocks)) not in old:
            print(f"{path.name}: no <!-- generated:{next(iter(blocks))} --> block, skipped")
            continue
        new = fill(old, blocks)
        if new == old:
            continue
        stale_files.append(path.name)
        if check:
            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), path.name, "generated")
            print("\n".join(diff))
        else:
            path.write_text(new)
    if check and stale_files:
        print(f"stale: {', '.join(stale_files)}; run python docs/tools/results_tables.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
