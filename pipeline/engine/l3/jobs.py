"""One write-back or fetch of a rank: page keys, the pages they go with, and the fetch's state."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.core.l3 import check_keys
from pipeline.core.model import Unit
from pipeline.core.plan import PlanSpec
from pipeline.core.slots import PageAllocator, pages_of
from pipeline.core.storage import StorageConfig
from pipeline.engine.runtime import Runtime

Run = tuple[int, int, "Future[int]"]
"""Reads of a run [first, stop) of a job's pages: (first, stop, how many of its pages were
read intact, from the first: they stop at a miss). A future a run, not a page: a fetch of
256 pages made, waited for and cancelled 256 futures under Python's lock before the
forward could start."""


@dataclass
class ObjectsJob:
    """One write-back or fetch on this rank: page keys and the pages they go with."""

    keys: list[str]
    host_pages: np.ndarray
    """Local host page of each key."""
    device_pages: np.ndarray | None = None
    """A fetch: the device page of each key (written directly after a fallback)."""
    hits: int = 0
    """A fetch: the leading pages whose objects were read intact (on every rank once agreed)."""
    fallback: bool = False
    """A fetch: the ranks' plans differed, so each reads every object into its own device
    pages and no exchange runs."""
    window_pages: int = 0
    """A fetch: pages agreed on and handed to `release` at a time (0: all at once)."""
    release: Callable[[int, int], None] | None = None
    """A fetch: loads pages [first, stop) once the group agreed they are hits (not after a
    fallback: those pages are already in place)."""
    reads: list[Run] = field(default_factory=list)
    """A fetch: this rank's reads in flight, in runs of pages (a window, or a page where
    pages are read a call each)."""
    units: tuple[Unit, ...] = ()
    """A fetch: the units it reads of each page (empty: every unit this rank reads); a
    streamed load reads a group of layers at a time (`pipeline.engine.l3.load`)."""
    tables: list[list[int]] = field(default_factory=list)
    """A streamed fetch: each page's digest table, filled by its first group's read and
    checked against by the later groups' (empty: a table per read, not kept)."""
    later: list[tuple[Unit, ...]] = field(default_factory=list)
    """A streamed fetch: the later groups of layers, read in the same store call as the
    first where the tier reads natively, so they need not wait for the hits to be agreed."""
    later_reads: list[Future[int]] = field(default_factory=list)
    """Per later group, how many pages from the first it read intact (kept past the fetch
    only where every page was a hit; else cancelled and waited for)."""
    task: Future[None] | None = None
    """The native store call reading the job's pages (and a streamed fetch's later groups):
    waited for by `fetch.drain`, as its last ranges land after the futures they belong to."""

    def plan_digest(self) -> bytes:
        """SHA-256 of the logical plan: keys, host pages and device pages, in order."""
        sha = hashlib.sha256()
        sha.update("\n".join(self.keys).encode())
        sha.update(np.asarray(self.host_pages, dtype=np.int64).tobytes())
        if self.device_pages is not None:
            sha.update(np.asarray(self.device_pages, dtype=np.int64).tobytes())
        return sha.digest()


def objects_job(
    keys: list[str],
    host_indices: torch.Tensor,
    device_indices: torch.Tensor | None,
    spec: PlanSpec,
    host_allocator: PageAllocator,
) -> ObjectsJob:
    """A write-back's job (no device slots; its host pages must hold data) or a fetch's (its
    host pages must hold none: it would overwrite them), on allocated host pages not lent to
    a prefetch; ValueError naming the argument otherwise, before any byte moves."""
    per_page = spec.slots_per_page
    host = pages_of("host_indices", host_indices, per_page, spec.host_slots).numpy()
    check_keys(keys, len(host))
    host_allocator.require_own("host_indices", host)
    empty = host_allocator.without_data(host)
    if device_indices is None:
        if empty:
            raise ValueError(f"host_indices name pages that hold no data: {empty[:8]}")
        return ObjectsJob(keys, host)
    device = pages_of("device_indices", device_indices, per_page, spec.device_slots).numpy()
    if len(device) != len(host):
        raise ValueError(f"host_indices has {len(host)} pages but device_indices {len(device)}")
    if held := sorted(set(host.tolist()) - set(empty)):
        raise ValueError(f"host_indices name pages that hold data (a fetch overwrites): {held[:8]}")
    return ObjectsJob(keys, host, device)


def prefetch_job(
    keys: list[str], host_indices: torch.Tensor, spec: PlanSpec, host_allocator: PageAllocator
) -> ObjectsJob:
    """A prefetch's job: reads into allocated host pages that hold no data, not lent to
    another prefetch (the device pages come with the load); ValueError naming the argument
    otherwise, before any byte moves."""
    host = pages_of("host_indices", host_indices, spec.slots_per_page, spec.host_slots).numpy()
    check_keys(keys, len(host))
    host_allocator.require_own("host_indices", host)
    if held := sorted(set(host.tolist()) - set(host_allocator.without_data(host))):
        raise ValueError(f"host_indices name pages that hold data (a fetch overwrites): {held[:8]}")
    return ObjectsJob(keys, host)


CUDA_WINDOW_PAGES = 64
"""`storage.load_chunk_pages` on cuda when not given: a few windows per prefix, so the DMA of
one overlaps the reads of the next without a load issued per handful of pages."""


def window_pages(storage: StorageConfig, runtime: Runtime) -> int:
    """`storage.load_chunk_pages`, or its default for this rank's device."""
    if storage.load_chunk_pages is not None:
        return storage.load_chunk_pages
    return CUDA_WINDOW_PAGES if runtime.device.type == "cuda" else 0
