"""An ABBA table from a result folder's four bench runs (bench_1_old, bench_2_new, bench_3_new,
bench_4_old): each tree's mean issue ms. Run: python docs/benchmarks/results/abba.py FOLDER OLD NEW
(OLD, NEW: the column names of the two trees, e.g. d61fd63 5112da9).
"""

import json
import statistics
import sys
from pathlib import Path

OLD, NEW = ("bench_1_old", "bench_4_old"), ("bench_2_new", "bench_3_new")


def rows(folder: Path, name: str) -> list[dict]:
    with open(folder / f"{name}.json") as f:
        return json.load(f)["rows"]


def case(row: dict) -> tuple:
    graphs = "yes" if row["cuda_graph_cache"] else "-" if row["io"] == "direct" else "no"
    return row["tokens"], row["direction"], row["placement"], row["io"], graphs, row["chunk_pages"]


def ops(row: dict) -> str:
    """The copy calls one transfer made; '?' where the old tree recorded none (its loads)."""
    return " + ".join(f"{n} {op}" for op, n in row["ops"][0].items()) if "ops" in row else "?"


def main(folder: Path, old_name: str, new_name: str) -> None:
    table: dict[tuple, dict[str, dict]] = {}
    for name in OLD + NEW:
        for row in rows(folder, name):
            table.setdefault(case(row), {})[name] = row
    print(
        "| tokens (pages) | direction | placement | io | graphs | chunk "
        f"| {old_name} issue ms | {new_name} issue ms | new / old | x floor (new) "
        "| copy calls old / new | bit-exact |"
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
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
