"""Writes the result files whose raw bench JSON was never committed, from the tables of
docs/benchmarks/history/2026-12-05-benchmarks-before-the-rewrite.md (BENCHMARKS.md at b9554ca).
Each file says so in its "source". Run once; the history file does not change, so a rerun
writes the same files: python docs/benchmarks/results/transcribe.py
"""

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent
HISTORY = RESULTS.parents[1] / "benchmarks/history/2026-12-05-benchmarks-before-the-rewrite.md"
TEXT = HISTORY.read_text()
H200 = "1x NVIDIA H200 (nvidia-h200, 16 cores)"
H200X2 = "2x NVIDIA H200, NVLink between them (NV18), PCIe Gen5 x16 each (nvidia-h200-x2)"
SOFTWARE = "torch 2.11.0+cu130 (CUDA 13.0), driver 580.159.04, Python 3.12"
TRANSFER_PATHS = [
    "pipeline/engine/",
    "pipeline/spec/",
    "pipeline/core/",
    "pipeline/jobs/bench/",
    "stages/",
]
L3_PATHS = [*TRANSFER_PATHS, "pipeline/storage/"]


def cell(text: str) -> object:
    """A table cell as a number where it is one, else its text without emphasis."""
    text = text.strip().strip("*").strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text.rstrip("x"))
    except ValueError:
        return text


def table(heading: str, column: str) -> list[dict]:
    """The rows of the first table after `heading` whose header has `column`."""
    lines = TEXT[TEXT.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| ") and column in line)
    names = [c.strip().strip("*").strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, map(cell, line.strip("|").split("|")), strict=True)))
    return rows


def source(heading: str) -> str:
    return (
        f"transcribed from BENCHMARKS.md at b9554ca, section {heading!r}; raw bench JSON not kept"
    )


def rename(rows: list[dict], names: dict[str, str]) -> list[dict]:
    """Rows with the columns of `names` only, under the names it gives them."""
    return [{new: row[old] for old, new in names.items()} for row in rows]


TRANSFER = {"direction": "direction", "placement": "placement", "io": "io"}
TRANSFER |= {"graphs": "graphs", "chunk": "chunk"}


def tp2_matrix() -> dict:
    names = {**TRANSFER, "tokens": "tokens", "strategy": "strategy", "ms": "ms"}
    names |= {"GB/s per rank": "gbps_per_rank", "x floor": "x_floor"}
    names |= {"hand loop ms": "hand_loop_ms", "x hand loop": "x_hand_loop"}
    names |= {"issue ms": "issue_ms", "bit-exact": "bit_exact"}
    headings = ["### 16K tokens (1.15 GB)", "### 64K tokens (4.6 GB)"]
    rows = [r for h in headings for r in rename(table(h, "hand loop ms"), names)]
    return {
        "what": "TP2 transfer matrix: deepseek_v3, every strategy, placement, io, graphs, chunk",
        "commit": "923a77f",
        "date": "2026-11-30",
        "hardware": H200X2,
        "software": SOFTWARE,
        "command": "hicache-pipeline bench model=deepseek_v3 topology.device=cuda "
        + '"bench.sizes=[16384]" (and "bench.sizes=[65536]"), one size per device call',
        "paths": TRANSFER_PATHS,
        "source": source("Latest: the full matrix (commit 923a77f)")
        + "; 16K from the third device call, 64K from the second",
        "limit": "x_floor: the host-path floor (unique bytes / both GPUs' pinned bandwidth at "
        "once, or the broadcast floor where larger) over ms; replicated's ceiling is 0.5",
        "rows": rows,
    }


def tp1_transfers(heading: str, commit: str, gpu_ms: str, issue_ms: str, x_floor: str) -> dict:
    names = {**TRANSFER, "tokens (pages)": "tokens", gpu_ms: "ms", issue_ms: "issue_ms"}
    names |= {x_floor: "x_floor"}
    rows = rename(table(heading, gpu_ms), names)
    for row in rows:
        row["tokens"] = int(str(row["tokens"]).split()[0])
    return {
        "what": "one-GPU transfers (tp1, replicated): GPU ms and host issue ms",
        "commit": commit,
        "date": "2026-12-02",
        "hardware": H200,
        "software": SOFTWARE,
        "command": "hicache-pipeline bench model=deepseek_v3 topology=tp1 topology.device=cuda "
        + '"bench.strategies=[replicated]" "bench.sizes=[512,16384]" '
        + "(the b017ae9 run adds 64 and 4096)",
        "paths": TRANSFER_PATHS,
        "source": source(heading),
        "limit": "x_floor: one GPU's pinned host-path floor over ms",
        "rows": rows,
    }


TTFT = {"store": "store", "new tokens": "new_tokens", "load ms": "load_ms"}
TTFT |= {"compute ms": "compute_ms", "overlapped ms": "overlapped_ms", "x ideal": "x_ideal"}
TTFT |= {"recompute ms": "recompute_ms", "hit vs recompute": "hit_vs_recompute"}
TTFT_COMMAND = (
    "python3 -m pipeline bench bench=ttft model=deepseek_v3 topology=tp1 topology.device=cuda "
    "topology.mem_layout=page_first_direct topology.io_backend=direct bench.warmup=1 "
)
TTFT_PATHS = [*L3_PATHS, "pipeline/jobs/bench/forward.py"]


def ttft_host() -> dict:
    heading = "### Rerun after the shape fix, and 64K host hits"
    found = table(heading, "waits per layer") + table("64K cached tokens, host hits", "waits")
    names = {"tokens": "tokens", **TTFT}
    rows = [r | {"stream_layers": "-"} for r in rename(found, names) if r["store"] == "none"]
    return {
        "what": "prefix-hit TTFT, host hits (store none), "
        + "deepseek_v3 forward sized as one TP8 rank",
        "commit": "3dc18b0",
        "date": "2026-12-02",
        "hardware": H200,
        "software": SOFTWARE + ", matplotlib 3.11.2",
        "command": TTFT_COMMAND + '"bench.sizes=[16384]" bench.repeats=3 runtime.timeout_s=180; '
        '"bench.sizes=[65536]" "bench.stores=[none]" bench.repeats=2',
        "paths": TTFT_PATHS,
        "source": source(heading) + "; its host-hit rows (store none); measured on the working "
        "tree at 3dc18b0",
        "limit": "x_ideal: overlapped ms over max(load ms, compute ms)",
        "rows": rows,
    }


def ttft_l3() -> dict:
    heading = "### Streamed loads, a reader per run of pages"
    names = {"tokens": "tokens", "stream_layers": "stream_layers", **TTFT}
    rows = rename(table(heading, "x ideal vs whole load"), names)
    rows += rename(table("64K cached tokens (one repetition", "x ideal vs whole load"), names)
    return {
        "what": "prefix-hit TTFT, hits from L3 (file store, Mooncake), whole objects and streamed",
        "commit": "29dc436",
        "date": "2026-12-03",
        "hardware": H200 + "; file store on the local disk (warm page cache), "
        "Mooncake master on loopback (TCP)",
        "software": SOFTWARE + ", mooncake-transfer-engine 0.3.13.post1 (CPU build)",
        "command": TTFT_COMMAND + 'runtime.timeout_s=300 "bench.sizes=[16384]" '
        '"bench.stores=[file,mooncake]" bench.repeats=3 storage.stream_layers=N '
        "(N = 0, 4, 8; and 4 with storage.io_threads=8); 64K: bench.repeats=1, N = 0, 8",
        "paths": TTFT_PATHS,
        "source": source(heading),
        "limit": "x_ideal: overlapped ms over max(load ms, compute ms)",
        "rows": rows,
    }


READ = re.compile(r"([\d.]+) \(([\d.]+), ([\d.]+)\)")


def l3_h200() -> dict:
    """The 2f722f2 rows of the H200 L3 table, one row per store, size and thread count."""
    heading = "## L3 read path on the H200 host (issue 24)"
    rows = []
    for row in table(heading, "I/O threads"):
        if row["code"] != "2f722f2":
            continue
        threads = row["I/O threads"]
        for tokens, column in (
            (16384, "file warm 16K ms (GB/s, x limit)"),
            (65536, "file warm 64K"),
        ):
            ms, gbps, x = READ.fullmatch(str(row[column])).groups()  # type: ignore[union-attr]
            rows.append(l3_row("file", "warm", threads, tokens, float(ms), float(gbps), float(x)))
        for tokens, column in ((16384, "Mooncake 16K (x raw)"), (65536, "Mooncake 64K")):
            ms, x = re.findall(r"[\d.]+", str(row[column]))
            gbps = round(tokens * 70272 / float(ms) / 1e6, 2)
            rows.append(l3_row("mooncake", "-", threads, tokens, float(ms), gbps, float(x)))
    return {
        "what": "load from L3 against the host's limits, H200 host (tp1, replicated)",
        "commit": "2f722f2",
        "date": "2026-12-01",
        "hardware": H200 + ", 125 GiB, ext4 on a virtio disk; Mooncake master on loopback (TCP)",
        "software": SOFTWARE + ", mooncake-transfer-engine 0.3.13.post1 (CPU build)",
        "command": "python3 -m pipeline bench bench=l3 model=deepseek_v3 topology=tp1 "
        "topology.device=cuda topology.mem_layout=page_first_direct topology.io_backend=direct "
        "'bench.strategies=[replicated]' runtime.timeout_s=180 storage.io_threads=4 (and =16)",
        "paths": L3_PATHS,
        "source": source(heading) + "; its 2f722f2 rows (Mooncake GB/s computed from ms "
        "at 70,272 B a token)",
        "limit": "x_limit: the load's GB/s over the same run's read limit at the same thread "
        "count (file warm: page-cache reads into pinned memory; Mooncake: its own "
        "batch_get_into loop)",
        "rows": rows,
    }


def l3_row(store: str, cache: str, threads: int, tokens: int, ms: float, gbps: float, x: float):
    io = "buffered" if store == "file" else "-"
    limit = "page-cache read" if store == "file" else "Mooncake raw loop"
    return {"store": store, "cache": cache, "io": io, "io_threads": threads, "tokens": tokens} | {
        "load_ms": ms,
        "gbps": gbps,
        "x_limit": x,
        "limit": limit,
    }


def l3_h200_cold() -> dict:
    """The cold reads at d762631, written in the section's prose, not a table."""
    heading = "## L3 read path on the H200 host (issue 24)"
    figures = [  # (io, tokens, load ms, x limit, limit GB/s), as the prose gives them
        ("buffered", 16384, 836.4, 0.84, 1.64),
        ("buffered", 65536, 4044.7, 0.83, 1.38),
        ("O_DIRECT", 16384, 928.6, 0.89, 1.90),
        ("O_DIRECT", 65536, 3107.1, 0.91, 1.73),
    ]
    rows = []
    for io, tokens, ms, x, limit in figures:
        gbps = round(tokens * 70272 / ms / 1e6, 2)
        row = l3_row("file", "cold", 4, tokens, ms, gbps, x)
        rows.append(row | {"io": io, "limit": f"cold {io} read, {limit} GB/s"})
    return l3_h200() | {
        "what": "cold loads from the file store against the cold read limits, H200 host",
        "commit": "d762631",
        "command": l3_h200()["command"].replace("(and =16)", "'bench.caches=[warm,cold]'"),
        "source": source(heading) + "; the cold-read figures of its prose (GB/s computed from "
        "ms at 70,272 B a token)",
        "rows": rows,
    }


def l3_cpu() -> dict:
    heading = "## L3 read path at the machine's limits (issue 24): the 2-vCPU CPU machine"
    names = {"store": "store", "cache": "cache", "io": "io", "tokens": "tokens"}
    names |= {"load ms": "load_ms", "GB/s": "gbps", "x limit": "x_limit"}
    names |= {"x read+copy": "x_read_copy"}
    rows = rename(table(heading, "x read+copy"), names)
    for row in rows:
        row["io_threads"] = 2
        row["limit"] = "read+copy" if row["store"] == "file" else "Mooncake raw loop"
        if isinstance(row["x_limit"], str):  # "1.29 (limit noisy)"
            row["x_limit"] = float(row["x_limit"].split()[0])
    return {
        "what": "load from L3 against the host's limits, CPU ranks "
        + "(the device tier is host memory)",
        "commit": "d61b40d",
        "date": "2026-12-01",
        "hardware": "2-vCPU, 24 GiB CPU machine, ext4 on a virtio disk (no GPU)",
        "software": "torch CPU build (version not recorded), Python 3.12 (as recorded: not stated)",
        "command": "hicache-pipeline bench bench=l3 model=deepseek_v3 topology=tp1 "
        "topology.mem_layout=page_first_direct topology.io_backend=direct storage.io_threads=2 "
        "'bench.sizes=[8192,16384]' 'bench.strategies=[replicated]' 'bench.caches=[warm,cold]'",
        "paths": L3_PATHS,
        "source": source(heading),
        "limit": "x_limit: the load's GB/s over the same run's read limit; x_read_copy: over a "
        "plain read of the same files plus one copy (the CPU bar: 0.7)",
        "rows": rows,
    }


def main() -> None:
    results = {
        "2026-11-30-h200x2-tp2-matrix": tp2_matrix(),
        "2026-12-02-h200-tp1-161883b": tp1_transfers(
            "**At 161883b**", "161883b", "GPU ms 161883b", "issue ms 161883b", "x floor"
        ),
        "2026-12-02-h200-tp1-b017ae9-small": tp1_transfers(
            "Small requests, the same after-run",
            "b017ae9",
            "GPU ms after",
            "issue ms after",
            "x floor after",
        ),
        "2026-12-02-h200-ttft-host": ttft_host(),
        "2026-12-03-h200-ttft-l3": ttft_l3(),
        "2026-12-01-h200-l3-read": l3_h200(),
        "2026-12-01-h200-l3-cold": l3_h200_cold(),
        "2026-12-01-cpu-l3-read": l3_cpu(),
    }
    for folder, result in results.items():
        (RESULTS / folder).mkdir(exist_ok=True)
        text = json.dumps(result, indent=1) + "\n"
        (RESULTS / folder / "result.json").write_text(text)


if __name__ == "__main__":
    main()
