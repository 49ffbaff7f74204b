"""What `bench bench=links` times: each of the cost model's links on this machine, by plain
torch and os calls (no engine), on buffers of `bench.floor_bytes`. Each probe returns GB/s
(copy_call_us: microseconds), the best of `bench.repeats` runs after `bench.warmup`: a link's
speed is what the machine can do."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import crc32c
import torch

from pipeline.engine.transfer.pools import uva_alias


def best_seconds(
    warmup: int, repeats: int, region: Callable[[], Any], sync: Callable[[], Any]
) -> float:
    """The shortest of `repeats` runs of `region` (each until `sync` returns)."""
    for _ in range(warmup):
        region()
        sync()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        region()
        sync()
        times.append(time.perf_counter() - began)
    return min(times)


class Probe:
    """The buffers and timing of one device: a pinned host buffer and a device one."""

    def __init__(
        self, device: torch.device, nbytes: int, page_bytes: int, warmup: int, repeats: int
    ) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self.pages = max(2, nbytes // page_bytes)
        self.host = torch.empty(self.pages, page_bytes, dtype=torch.uint8, pin_memory=self.cuda)
        self.host.random_(0, 255)
        self.dev = torch.empty_like(self.host, device=device)
        self.warmup, self.repeats = warmup, repeats
        self.ids = torch.randperm(self.pages, device=device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def gbps(self, region: Callable[[], Any]) -> float:
        return self.host.nbytes / best_seconds(self.warmup, self.repeats, region, self.sync) / 1e9

    def dma(self, to_device: bool) -> float:
        """One copy of the whole buffer (cudaMemcpyAsync on cuda; a memcpy on CPU)."""
        if to_device:
            return self.gbps(lambda: self.dev.copy_(self.host, non_blocking=True))
        return self.gbps(lambda: self.host.copy_(self.dev, non_blocking=True))

    def kernel(self, to_device: bool) -> float:
        """Pages at random ids through gather / scatter kernels (UVA on cuda), as
        io_backend=kernel moves fragmented pages."""
        far = uva_alias(self.host, self.device) if self.cuda else self.host
        if to_device:
            return self.gbps(lambda: torch.index_select(far, 0, self.ids, out=self.dev))
        return self.gbps(lambda: far.index_copy_(0, self.ids, self.dev))

    def copy_call_us(self, calls: int = 256) -> float:
        """Host time to issue one page's copy (the per-unit term of a transfer)."""
        rows = [(self.dev[i % self.pages], self.host[i % self.pages]) for i in range(calls)]
        times = []
        for _ in range(self.repeats):
            began = time.perf_counter()
            for dst, src in rows:
                dst.copy_(src, non_blocking=True)
            times.append(time.perf_counter() - began)
            self.sync()
        return min(times) / calls * 1e6


def peer_gbps(nbytes: int, warmup: int, repeats: int) -> float | None:
    """GPU 0 -> GPU 1 copy (a two-rank broadcast's algorithm bandwidth); None with one GPU."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")

    def sync() -> None:
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")

    return (
        nbytes
        / best_seconds(warmup, repeats, lambda: dst.copy_(src, non_blocking=True), sync)
        / 1e9
    )


def write_objects(folder: str, count: int, size: int, threads: int) -> float:
    """Seconds to write `count` new files of `size` bytes, `threads` at a time."""
    data = os.urandom(size)

    def one(i: int) -> None:
        fd = os.open(f"{folder}/{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - began


def read_objects(folder: str, count: int, size: int, threads: int, readers: int) -> float:
    """Seconds for `readers` readers, each reading and checking (CRC-32C) every file on
    `threads` threads of its own, all at once: what a rank's load from a file store does per
    byte."""
    buffers: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(threads * readers):  # one buffer per thread, as the tier's I/O threads keep
        buffers.put(bytearray(size))

    def one(i: int) -> int:
        buffer = buffers.get()
        try:
            fd = os.open(f"{folder}/{i % count}", os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.preadv(fd, [buffer], 0)
            finally:
                os.close(fd)
            return crc32c.crc32c(buffer)
        finally:
            buffers.put(buffer)

    began = time.perf_counter()
    with ThreadPoolExecutor(threads * readers) as pool:
        list(pool.map(one, range(count * readers)))
    return time.perf_counter() - began
