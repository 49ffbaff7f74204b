"""The host layout and io backend a job runs with: an auto layout chosen for the job, then the
normalizations a serving engine makes, each said in a note (`explain` prints them)."""

from __future__ import annotations

import dataclasses

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import IoBackend, MemLayout, Topology


def normalize(topology: Topology, storage: StorageConfig) -> tuple[Topology, tuple[str, ...]]:
    """Choose an auto layout for the job, apply the layout/io normalizations a serving engine
    makes, and say so in notes."""
    notes = []
    t = topology
    if t.mem_layout is MemLayout.auto:
        t, why = auto_layout(t, storage)
        if why:  # said where it departs from the token-major pool a preset names
            notes.append(f"mem_layout auto -> {t.mem_layout.value}: {why}")
    if t.mem_layout is MemLayout.page_first_direct and t.io_backend is IoBackend.kernel:
        t = dataclasses.replace(t, io_backend=IoBackend.direct)
        notes.append("io_backend kernel -> direct: page_first_direct pages are copied directly")
    if t.mem_layout is MemLayout.page_first and t.io_backend is IoBackend.direct:
        t = dataclasses.replace(t, mem_layout=MemLayout.page_first_direct)
        notes.append(
            "mem_layout page_first -> page_first_direct: the direct backend copies whole pages"
        )
    return t, tuple(notes)


def auto_layout(topology: Topology, storage: StorageConfig) -> tuple[Topology, str]:
    """mem_layout=auto for this job, and why ("" for the token-major default). With an L3
    store, page_first_direct: an object (a page's every layer) lands in the pool as one run,
    and each layer of a page moves to the device as one block, where page_first scatters both
    into rows a token apart (docs/l3.md has the measurements). Without one, page_first, the
    pool serving engines pair with io_backend=kernel."""
    if storage.kind is StorageKind.none:
        return dataclasses.replace(topology, mem_layout=MemLayout.page_first), ""
    why = f"storage={storage.kind.value}: an object lands whole, a page's layer is one block"
    return dataclasses.replace(topology, mem_layout=MemLayout.page_first_direct), why
