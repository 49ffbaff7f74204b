"""The host layout and io backend a job runs with: an auto layout resolved, then the
normalizations a serving engine makes, each said in a note (`explain` prints them)."""

from __future__ import annotations

import dataclasses

from pipeline.core.topology import IoBackend, MemLayout, Topology


def normalize(topology: Topology) -> tuple[Topology, tuple[str, ...]]:
    """Resolve an auto layout, apply the layout/io normalizations a serving engine makes, and
    say those in notes."""
    notes = []
    t = topology
    if t.mem_layout is MemLayout.auto:  # unsaid: what auto means (the presets' comments)
        t = auto_layout(t)
    if t.mem_layout is MemLayout.page_first_direct and t.io_backend is IoBackend.kernel:
        t = dataclasses.replace(t, io_backend=IoBackend.direct)
        notes.append("io_backend kernel -> direct: page_first_direct pages are copied directly")
    if t.mem_layout is MemLayout.page_first and t.io_backend is IoBackend.direct:
        t = dataclasses.replace(t, mem_layout=MemLayout.page_first_direct)
        notes.append(
            "mem_layout page_first -> page_first_direct: the direct backend copies whole pages"
        )
    return t, tuple(notes)


def auto_layout(topology: Topology) -> Topology:
    """mem_layout=auto: page_first_direct and the direct backend that copies it, with or
    without a store, whatever io backend was named (topology.mem_layout=page_first keeps
    kernels). Each layer of a page is one block on both sides, so it moves to and from the
    device as one copy, where page_first scatters it into rows a token apart (faster prefix
    hits from the host tier on a GPU, and copies on a CPU rank: BENCHMARKS.md), and an L3
    object (a page's every layer) lands in the pool as one run (docs/l3.md)."""
    return dataclasses.replace(
        topology, mem_layout=MemLayout.page_first_direct, io_backend=IoBackend.direct
    )
