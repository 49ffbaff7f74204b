"""`bench bench=links`: this machine's link speeds for the cost model, in a few seconds, written
as a links file (`bench.out_dir`/links.yaml) that `runtime.links=<that path>` reads.

Measured here: host <-> device DMA and UVA kernels (one GPU at a time), the host's time to
issue one copy, a GPU -> GPU copy where two GPUs are visible (a two-rank broadcast's algorithm
bandwidth), and a file store's read per reader, read of every rank of `topology.tp_size` at
once, and write, on files in a temporary folder. What cannot be measured here (the broadcast
with one GPU, the inter-node link, Mooncake) keeps the value of the preset `runtime.links`
names, and the result says so row by row.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from pipeline.config.compose import Session
from pipeline.config.links import links_of
from pipeline.core.cost import Links
from pipeline.engine.runtime import pick_device
from pipeline.jobs.bench.link_probes import Probe, peer_gbps, read_objects, write_objects
from pipeline.jobs.outputs import check_outputs, write_output
from pipeline.jobs.scratch import made_folder

OBJECTS = 16
"""Files the store probes write and read (bench.floor_bytes over them)."""


def measured(session: Session) -> dict[str, float]:
    """Every link this machine lets the bench time, by Links field."""
    job = session.job()
    device = pick_device(job.topology.device, 0)
    bench, threads = job.bench, job.storage.io_threads
    page = max(u.page_bytes for u in job.model.units)
    probe = Probe(device, bench.floor_bytes, page, bench.warmup, bench.repeats)
    found = {
        "h2d_gbps": probe.dma(True),
        "d2h_gbps": probe.dma(False),
        "h2d_kernel_gbps": probe.kernel(True),
        "d2h_kernel_gbps": probe.kernel(False),
        "copy_call_us": probe.copy_call_us(),
    }
    if (peer := peer_gbps(bench.floor_bytes, bench.warmup, bench.repeats)) is not None:
        found["broadcast_gbps"] = peer
    size = max(1, bench.floor_bytes // OBJECTS)
    folder = made_folder("hicache-links-")
    try:
        total = size * OBJECTS
        writes = [write_objects(folder, OBJECTS, size, threads) for _ in range(bench.repeats)]
        found["file_write_gbps"] = total / min(writes) / 1e9
        best = [read_objects(folder, OBJECTS, size, threads, 1) for _ in range(bench.repeats)]
        found["file_read_gbps"] = total / min(best) / 1e9
        readers = job.topology.tp_size
        best = [read_objects(folder, OBJECTS, size, threads, readers) for _ in range(bench.repeats)]
        found["file_read_aggregate_gbps"] = total * readers / min(best) / 1e9
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return found


def run_links_bench(session: Session) -> dict[str, Any]:
    """Measure, write links.yaml, read it back as `runtime.links` would; "ok" when it reads."""
    job = session.job()
    out = Path(job.bench.out_dir)
    check_outputs("bench.out_dir", out, ["links.yaml"])
    preset = links_of(job.runtime.links)
    found = measured(session)
    device = pick_device(job.topology.device, 0)
    machine = f"bench links on {device.type}"
    links = dataclasses.replace(preset, machine=machine, **found)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "links.yaml"
    write_output(path, links_yaml(links, set(found), preset.machine))
    read_back = links_of(str(path))
    rows = [
        {
            "link": f.name,
            "value": round(getattr(links, f.name), 3),
            "preset": getattr(preset, f.name),
            "source": "measured" if f.name in found else f"preset {preset.machine}",
        }
        for f in dataclasses.fields(Links)
        if f.name != "machine"
    ]
    return {"ok": read_back == links, "machine": machine, "file": str(path), "rows": rows}


def links_yaml(links: Links, measured_keys: set[str], preset: str) -> str:
    """The links file: one `key: value` line each, the unmeasured ones marked."""
    lines = [f"# {links.machine}: runtime.links=<this file> reads it (GB/s; copy_call_us: us)"]
    lines.append(f"machine: {links.machine}")
    for f in dataclasses.fields(Links):
        if f.name == "machine":
            continue
        note = "" if f.name in measured_keys else f"  # not measured here: preset {preset}"
        lines.append(f"{f.name}: {getattr(links, f.name)!r}{note}")
    return "\n".join(lines) + "\n"


def links_text(result: dict[str, Any]) -> str:
    width = max(len(r["link"]) for r in result["rows"])
    lines = [f"{result['machine']} (written to {result['file']})"]
    lines.append(f"{'link':<{width}}  {'value':>10}  {'preset':>10}  source")
    lines += [
        f"{r['link']:<{width}}  {r['value']:>10.3f}  {r['preset']:>10.3f}  {r['source']}"
        for r in result["rows"]
    ]
    return "\n".join(lines)
