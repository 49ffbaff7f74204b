"""`bench`: strategies side by side with a hand-written loop and the links' measured floors.

The parent composes one config per case (strategy x size x placement x io backend), every rank
measures floors and cases (`bench.rank`), and the parent turns per-rank medians into one row per
case and direction: the slowest rank's median time, GB/s per rank, the ratio to the host-path
floor and to the hand-written loop, the CPU issue time, and bit-exactness. Output: bench.json,
bench.md and bench.png in `bench.out_dir`.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from pipeline.config.compose import GROUP_CHOICE_PREFIXES, Session
from pipeline.config.job import Job
from pipeline.config.links import links_of
from pipeline.config.schema import BenchConfig
from pipeline.engine.runtime import pick_device
from pipeline.jobs.bench.cases import check_fit, launch_cases
from pipeline.jobs.bench.output import markdown, plot, with_estimates
from pipeline.jobs.bench.rank import bench_rank
from pipeline.jobs.outputs import check_outputs, write_output

LAYOUT_FOR_IO = {"direct": "page_first_direct", "kernel": "layer_first"}
"""The host layout each io backend is measured with (the pairs rotating accepts)."""


def cases(
    session: Session, bench: BenchConfig, on_cuda: bool
) -> tuple[list[tuple[Job, dict]], list[dict]]:
    """(runnable (job, case) pairs, skipped cases with the reason) for the bench config.
    CUDA graph settings multiply only cuda kernel-backend cases (nothing else is graphed)."""
    kept = [o for o in session.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
    runnable, skipped = [], []
    for tokens in bench.sizes:
        for placement in bench.placements:
            ios = bench.contiguous_io if placement.value == "contiguous" else bench.fragmented_io
            for io, chunk, strategy in itertools.product(ios, bench.chunk_pages, bench.strategies):
                graphed = on_cuda and io.value == "kernel"
                graph_settings = bench.cuda_graph_cache if graphed else [0]
                for graphs in graph_settings:
                    case = {
                        "tokens": tokens,
                        "placement": placement.value,
                        "io": io.value,
                        "chunk_pages": chunk,
                        "strategy": strategy,
                        "cuda_graph_cache": graphs,
                    }
                    job = Session.compose(
                        [
                            *kept,
                            f"strategy={strategy}",
                            f"topology.io_backend={io.value}",
                            f"topology.mem_layout={LAYOUT_FOR_IO[io.value]}",
                            f"workload.num_tokens={tokens}",
                            # the case's pools: source and target on the device, one
                            # transfer on the host
                            f"workload.device_tokens={2 * tokens}",
                            "workload.host_ratio=0.5",
                            f"strategy.chunk_pages={chunk}",
                            f"strategy.cuda_graph_cache={graphs}",
                            "strategy.keep_capacity=true",
                        ]
                    ).job()
                    if job.verdict.active:
                        runnable.append((job, case))
                    else:
                        why = [r.message for r in job.verdict.rules if not r.passed]
                        skipped.append({**case, "inactive": why})
    return runnable, skipped


def summarize(ranks: list[dict], runnable: list[tuple[Job, dict]], base: Job) -> dict[str, Any]:
    """One row per case and direction from every rank's repetitions."""
    model, topology = base.model, base.topology
    floors = {
        "h2d_alone_gbps": [r["floors"]["h2d_alone_gbps"] for r in ranks],
        "h2d_all_gbps": [r["floors"]["h2d_all_gbps"] for r in ranks],
        "d2h_alone_gbps": [r["floors"]["d2h_alone_gbps"] for r in ranks],
        "d2h_all_gbps": [r["floors"]["d2h_all_gbps"] for r in ranks],
        "broadcast_gbps": ranks[0]["floors"].get("broadcast_gbps"),
    }
    group = len(topology.replica_group(0, model))
    rows = []
    for i, (_, case) in enumerate(runnable):
        unique = case["tokens"] * model.bytes_per_token
        per_rank = [r["cases"][i] for r in ranks]
        for direction in ("backup", "load"):
            floor_s = _floor_s(direction, unique, floors, group)
            rows.append({**case, **_row(direction, per_rank, unique, floor_s)})
    return {
        "model": model.name,
        "topology": topology.name,
        "ranks": len(ranks),
        "device_name": ranks[0].get("device_name", "cpu"),
        "floors": floors,
        "rows": rows,
    }


def _floor_s(direction: str, unique: int, floors: dict[str, Any], group: int) -> float:
    """The host-path floor: unique bytes over every GPU's link at once, or the broadcast's
    share of a load where that is slower."""
    if direction == "backup":
        return unique / (sum(floors["d2h_all_gbps"]) * 1e9)
    floor_s = unique / (sum(floors["h2d_all_gbps"]) * 1e9)
    if group > 1 and floors["broadcast_gbps"]:
        floor_s = max(floor_s, unique * (group - 1) / group / (floors["broadcast_gbps"] * 1e9))
    return floor_s


def _row(direction: str, per_rank: list[dict], unique: int, floor_s: float) -> dict[str, Any]:
    """One direction of one case: the slowest rank's medians, ratios, ops, bit-exactness."""
    seconds = max(statistics.median(c[f"{direction}_s"]) for c in per_rank)
    reference = max(statistics.median(c[f"reference_{direction}_s"]) for c in per_rank)
    row: dict[str, Any] = {"ops": [c[f"{direction}_ops"] for c in per_rank]}
    if direction == "backup" and "unchunked_backup_s" in per_rank[0]:
        unchunked = max(statistics.median(c["unchunked_backup_s"]) for c in per_rank)
        row |= {
            "unchunked_ms": unchunked * 1e3,
            "x_unchunked": seconds / unchunked,
            "unchunked_ops": [c["unchunked_backup_ops"] for c in per_rank],
        }
    return {
        **row,
        "direction": direction,
        "ms": seconds * 1e3,
        "reference_ms": reference * 1e3,
        "gbps_per_rank": unique / seconds / 1e9,
        "x_floor": floor_s / seconds,
        "x_reference": reference / seconds,
        "issue_ms": max(c["issue_s"][direction] for c in per_rank) * 1e3,
        "best_issue_ms": max(c["best_issue_s"][direction] for c in per_rank) * 1e3,
        "reference_issue_ms": max(c["reference_issue_s"][direction] for c in per_rank) * 1e3,
        "bit_exact": all(c["bit_exact"] for c in per_rank),
        "reference_bit_exact": all(c["reference_bit_exact"] for c in per_rank),
        "unique_bytes": unique,
        "graphed": all("graphs_captured" in c for c in per_rank),
    }


def run_bench(session: Session) -> dict[str, Any]:
    """Every case on every rank; the summary, also written to `bench.out_dir`."""
    base = session.job()
    # the outputs first: checking them is instant, composing every case takes seconds
    outputs = ["bench.json", "bench.md", "bench.png"]
    check_outputs("bench.out_dir", Path(base.bench.out_dir), outputs)
    device = pick_device(base.topology.device, 0)
    runnable, skipped = cases(session, base.bench, device.type == "cuda")
    check_fit(runnable)
    ranks = launch_cases(bench_rank, base, runnable)
    if ranks is None:
        return {}
    result = summarize(ranks, runnable, base)
    with_estimates(result, runnable, links_of(base.runtime.links))  # the model beside each row
    result["skipped"] = skipped
    result["raw"] = ranks
    out = Path(base.bench.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_output(out / "bench.json", json.dumps(result, indent=2))
    write_output(out / "bench.md", markdown(result))
    result["png"] = plot(result, out / "bench.png")
    return result
