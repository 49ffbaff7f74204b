"""The issue-49 tree (new) against b65eb10 (old), ABBA on one host: each tree's mean issue ms.

Run from anywhere: python docs/benchmarks/results/2026-12-05-h200-after-issue-49/abba.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
OLD, NEW = ("bench_1_old", "bench_4_old"), ("bench_2_new", "bench_3_new")


def rows(name: str) -> list[dict]:
    with open(HERE / f"{name}.json") as f:
        return json.load(f)["rows"]


def case(row: dict) -> tuple:
    graphs = "yes" if row["cuda_graph_cache"] else "-" if row["io"] == "direct" else "no"
    return row["tokens"], row["direction"], row["placement"], row["io"], graphs, row["chunk_pages"]


def ops(row: dict) -> str:
    """The copy calls one transfer made; '?' where the old tree recorded none (its loads)."""
    return " + ".join(f"{n} {op}" for op, n in row["ops"][0].items()) if "ops" in row else "?"


def main() -> None:
    table: dict[tuple, dict[str, dict]] = {}
    for name in OLD + NEW:
        for row in rows(name):
            table.setdefault(case(row), {})[name] = row
    print(
        "| tokens (pages) | direction | placement | io | graphs | chunk | b65eb10 issue ms "
        "| issue 49 issue ms | new / old | x floor (new) | copy calls old / new | bit-exact |"
    )
    print("| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for (tokens, *rest), runs in table.items():
        old = statistics.mean(runs[n]["issue_ms"] for n in OLD)
        new = statistics.mean(runs[n]["issue_ms"] for n in NEW)
        x_floor = statistics.mean(runs[n]["x_floor"] for n in NEW)
        exact = all(r["bit_exact"] and r["reference_bit_exact"] for r in runs.values())
        cells = [f"{tokens} ({tokens // 64})", *map(str, rest), f"{old:.2f}", f"{new:.2f}"]
        cells += [f"{new / old:.2f}", f"{x_floor:.3f}", f"{ops(runs[OLD[0]])} / "]
        cells[-1] += ops(runs[NEW[0]])
        print("| " + " | ".join([*cells, "yes" if exact else "NO"]) + " |")


if __name__ == "__main__":
    main()
