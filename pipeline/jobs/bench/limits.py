"""What the machine can do with one case's objects, measured in the same run: the limits that
every L3 row is reported against.

All on the same objects the case wrote, by plain code without the framework: whole objects
read with `os.preadv` into one buffer (pinned on cuda) by 1, `storage.io_threads` and all cores'
threads from the page cache (warm), the same after the OS was asked to drop them (cold), a
rotating owner's ranged read (every other unit of each object) next to the whole read, one
host -> device copy of the buffer, the same bytes written as new files (the page-cache write
limit), CRC-32C over the buffer, and for Mooncake the client's own `batch_get_into` into one
registered buffer.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import queue
import secrets
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from pipeline.core.l3 import digest
from pipeline.engine.l3.stores import FileStore, MooncakeStore
from pipeline.engine.l3.stores.direct import ALIGN
from pipeline.engine.l3.tier import L3Tier


def best_of(repeats: int, region: Callable[[], Any]) -> float:
    """The shortest of `repeats` runs of `region`, in seconds (a limit is what the machine
    can do, so the best run is the fair one)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        region()
        times.append(time.perf_counter() - began)
    return min(times)


def _slices(buffer: torch.Tensor, sizes: list[int]) -> list[memoryview]:
    flat, found, first = buffer.numpy().data.cast("B"), [], 0
    for size in sizes:
        found.append(flat[first : first + size])
        first += size
    return found


def _read_whole(pool: ThreadPoolExecutor, paths: list[str], views: list[memoryview]) -> None:
    def one(i: int) -> None:
        fd = os.open(paths[i], os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.preadv(fd, [views[i]], 0)
        finally:
            os.close(fd)

    list(pool.map(one, range(len(paths))))


def _read_ranged(pool: ThreadPoolExecutor, paths: list[str], spans: list[tuple[int, int]]) -> int:
    """Read the byte `spans` of every file (one preadv each, into one reused buffer per
    thread); the bytes read."""
    largest = max(n for _, n in spans)

    def one(path: str) -> None:
        scratch = bytearray(largest)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            for at, n in spans:
                os.preadv(fd, [memoryview(scratch)[:n]], at)
        finally:
            os.close(fd)

    list(pool.map(one, paths))
    return len(paths) * sum(n for _, n in spans)


def file_limits(
    tier: L3Tier, store: FileStore, keys: list[str], *, io_threads: int, repeats: int, cuda: bool
) -> dict[str, Any]:
    """The file store's limits for the objects of `keys` (GB/s; None where not measurable).
    Each thread count's threads are started once, outside the timed regions, as the tier's
    are."""
    cores = os.cpu_count() or 1
    with contextlib.ExitStack() as stack:
        pools = {
            t: stack.enter_context(ThreadPoolExecutor(t)) for t in sorted({1, io_threads, cores})
        }
        return _file_limits(tier, store, keys, pools, io_threads, repeats, cuda)


def _file_limits(
    tier: L3Tier,
    store: FileStore,
    keys: list[str],
    pools: dict[int, ThreadPoolExecutor],
    io_threads: int,
    repeats: int,
    cuda: bool,
) -> dict[str, Any]:
    names = [tier.name(k) for k in keys]
    paths = [os.path.join(store.root, n) for n in names]
    sizes = [os.stat(p).st_size for p in paths]
    total = sum(sizes)
    buffer = torch.empty(total, dtype=torch.uint8, pin_memory=cuda)
    views = _slices(buffer, sizes)
    io = pools[io_threads]
    warm = {}
    for threads, pool in pools.items():
        seconds = best_of(repeats, functools.partial(_read_whole, pool, paths, views))
        warm[threads] = total / seconds / 1e9
    copy = device_copy(buffer, cuda)

    def read_and_copy() -> None:
        _read_whole(io, paths, views)
        copy()

    copy_s = best_of(repeats, copy)

    obj = tier.object
    head = obj.header_size(tier.space, names[0])
    spans = [(head + obj.offsets[u.ordinal], u.page_bytes) for u in obj.units[::2]]
    ranged_s = best_of(repeats, lambda: _read_ranged(io, paths, spans))
    cold_s = None
    if dropped := store.forget_cached(names):
        cold_s = min(_cold_read(store, names, io, paths, views) for _ in range(repeats))
    direct_s = direct_read(io, io_threads, paths, sizes, repeats)
    return {
        "bytes": total,
        "direct_read_gbps": total / direct_s / 1e9 if direct_s else None,
        "warm_read_gbps": {str(t): g for t, g in warm.items()},
        "cold_read_gbps": total / cold_s / 1e9 if cold_s else None,
        "cold_note": "" if dropped else "the store lives in memory (tmpfs): nothing to drop",
        "h2d_gbps": total / copy_s / 1e9,
        "read_copy_gbps": total / best_of(repeats, read_and_copy) / 1e9,
        "ranged_gbps": len(paths) * sum(n for _, n in spans) / ranged_s / 1e9,
        "ranged_s": ranged_s,
        "whole_s": total / warm[io_threads] / 1e9,
        "write_gbps": total / write_files(store, io, views, repeats) / 1e9,
        "digest_gbps": total / best_of(repeats, lambda: digest(buffer.numpy().data)) / 1e9,
    }


def direct_read(
    pool: ThreadPoolExecutor, threads: int, paths: list[str], sizes: list[int], repeats: int
) -> float | None:
    """Seconds to read every file whole with O_DIRECT (around the page cache, into aligned
    buffers, `threads` at a time); None where the file system refuses it (tmpfs)."""
    whole = -(-max(sizes) // ALIGN) * ALIGN
    buffers: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
    for _ in range(threads):
        buffers.put(mmap.mmap(-1, whole))  # an anonymous mapping starts on a page

    def one(path: str) -> None:
        buffer = buffers.get()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECT)
        try:
            os.preadv(fd, [buffer], 0)
        finally:
            os.close(fd)
            buffers.put(buffer)

    def read_all() -> None:
        list(pool.map(one, paths))

    try:
        return best_of(repeats, read_all)
    except OSError:
        return None


def device_copy(buffer: torch.Tensor, cuda: bool) -> Callable[[], None]:
    """One host -> device copy of `buffer` (on CPU: into another host buffer), synchronized."""
    target = torch.empty_like(buffer, device="cuda" if cuda else "cpu")

    def copy() -> None:
        target.copy_(buffer)
        if cuda:
            torch.cuda.synchronize()

    return copy


def _cold_read(
    store: FileStore,
    names: list[str],
    pool: ThreadPoolExecutor,
    paths: list[str],
    views: list[memoryview],
) -> float:
    store.forget_cached(names)
    began = time.perf_counter()
    _read_whole(pool, paths, views)
    return time.perf_counter() - began


def write_files(
    store: FileStore, pool: ThreadPoolExecutor, views: list[memoryview], repeats: int
) -> float:
    """Seconds to write `views` as new files (each written whole with writev, `threads` at a
    time) in a folder of the store's own, removed after: the page-cache write limit."""
    folder = os.path.join(store.root, f"limit-{secrets.token_hex(4)}")

    def write_all() -> None:
        os.mkdir(folder)

        def one(i: int) -> None:
            fd = os.open(f"{folder}/{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
            try:
                os.writev(fd, [views[i]])
            finally:
                os.close(fd)

        list(pool.map(one, range(len(views))))

    try:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            write_all()
            times.append(time.perf_counter() - began)
            shutil.rmtree(folder)
        return min(times)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mooncake_limits(
    tier: L3Tier, store: MooncakeStore, keys: list[str], *, repeats: int, cuda: bool
) -> dict[str, Any]:
    """The Mooncake client's own loop: `batch_get_into` of the objects the store keeps `keys`'
    pages as (their pieces, `mooncake_pieces`) into one registered buffer; as many bytes a
    page put as one object and read the same way (what the pieces cost); and one host ->
    device copy of the buffer (GB/s of the pages' bytes)."""
    names = [tier.name(k) for k in keys]
    size = tier.object.header_size(tier.space, names[0]) + tier.object.page_bytes
    lengths = store.pieces.sizes(names[0], size)  # a page's objects as the store keeps them
    stride = sum(lengths)
    buffer = np.empty(stride * len(names), dtype=np.uint8)
    client = store.client
    if client.register_buffer(buffer.ctypes.data, buffer.nbytes) != 0:
        raise RuntimeError("Mooncake refused to register the raw loop's buffer")
    kept = [piece for name in names for piece in store.pieces.names(name)]
    firsts = np.cumsum([0, *lengths[:-1]]).tolist()
    ptrs = [buffer.ctypes.data + i * stride + at for i in range(len(names)) for at in firsts]
    lengths *= len(names)
    whole = [f"{name}.raw-{secrets.token_hex(4)}" for name in names]  # this run's own
    starts = [buffer.ctypes.data + i * stride for i in range(len(names))]
    try:

        def get(objects: list[str], into: list[int], sizes: list[int]) -> Callable[[], None]:
            def get_all() -> None:
                if client.batch_get_into(objects, into, sizes) != sizes:
                    raise RuntimeError(f"Mooncake's raw loop did not read {objects[0]} whole")

            return get_all

        raw_s = best_of(repeats, get(kept, ptrs, lengths))  # the buffer holds the pages
        if any(client.batch_put_from(whole, starts, [size] * len(names))):
            raise RuntimeError("Mooncake's raw loop could not put the pages as whole objects")
        whole_s = best_of(repeats, get(whole, starts, [size] * len(names)))
        host = torch.from_numpy(buffer)
        copy_s = best_of(repeats, device_copy(host.pin_memory() if cuda else host, cuda))
        moved = size * len(names)
        return {
            "bytes": moved,
            "raw_gbps": moved / raw_s / 1e9,
            "raw_whole_gbps": moved / whole_s / 1e9,
            "h2d_gbps": buffer.nbytes / copy_s / 1e9,
        }
    finally:
        client.batch_remove(whole, True)
        client.unregister_buffer(buffer.ctypes.data)
