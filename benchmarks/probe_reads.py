"""Read candidates for the file store's native read path, side by side on the same files.

N page objects (deepseek_v3's: 64 tokens x 61 layers x 1152 B) in a file store, read warm into
one buffer by each candidate on T threads (each its share, opened once per load), R ranges per
object (61: a layer-wise load); one missing or failing is a row saying why. From the root:
    python benchmarks/probe_reads.py --pages 128 --threads 1 2 --ranges 1 61 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import crc32c
import numpy as np
import torch
import torch.distributed as dist

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.l3.batch import batched, read_batch
from pipeline.engine.l3.stores._fileio import read_objects
from pipeline.jobs.contents import fill_random

NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
HICACHE = "sglang.srt.mem_cache.hicache_storage"
SMOKE = {  # run in a child first: a package whose native code kills the process is a row
    "liburing": "import liburing as L; r = vars(L).get('Ring') or L.io_uring\n"
    "L.io_uring_queue_init(8, r())",
    "nixl_cu12": "import nixl_cu12",
    HICACHE: f"import {HICACHE}",
}
CANDIDATES = [  # name, package, its read (made in the try), whether it reads ranges, its check
    ("preadv", "", lambda p: preadv, True, "files"),
    ("read_objects", "", lambda p: native, True, "files"),
    ("store-read", "", lambda p: store_read, False, "own CRCs"),
    ("load_from_l3", "", lambda p: load_from_l3, False, "own CRCs"),
    ("liburing", "liburing", lambda p: uring, True, "files"),
    ("nixl-uring", "nixl_cu12", lambda p: nixl(p, "use_uring"), True, "files"),
    ("nixl-aio", "nixl_cu12", lambda p: nixl(p, "use_aio"), True, "files"),
    ("sglang", HICACHE, lambda p: sglang(p), False, "files"),
    ("crc-unit", "", lambda p: functools.partial(crc, per_unit=True), False, "-"),
    ("crc-object", "", lambda p: functools.partial(crc, per_unit=False), False, "-"),
    ("copy", "", lambda p: copy, False, "files"),
]
SIZES = {"pages": 128, "layers": 61, "page-tokens": 64, "row-bytes": 1152, "repeats": 7}


def probe_args(pages: int, override: list[str]) -> argparse.Namespace:
    """A `Probe`'s arguments for `pages` objects of the default sizes, as another script
    that loads them gives them (`time_loads.py`, `load_phases.py`)."""
    sizes = {k.replace("-", "_"): v for k, v in SIZES.items() if k != "pages"}
    return argparse.Namespace(pages=pages, override=override, **sizes)


class Share(NamedTuple):  # a thread's objects, their reads, and those as an array
    k: int
    objs: list[int]
    reads: list[tuple[int, int, int, int]]  # object, offset in it, bytes, offset in the buffer
    table: np.ndarray


class Probe:
    """An engine reading with T I/O threads, its N pages' objects, and the buffer to fill."""

    def __init__(self, args: argparse.Namespace, threads: int, folder: str, mods: dict) -> None:
        n, tokens = args.pages, args.pages * args.page_tokens
        job = pipeline.compose(
            f"model=deepseek_v3 model.num_layers={args.layers} model.kv_row_bytes={args.row_bytes}"
            f" model.page_size={args.page_tokens} topology=tp1 topology.device=cpu storage=file"
            f" storage.path={folder} strategy=replicated storage.io_threads={threads}"
            f" workload.num_tokens={tokens} workload.device_tokens={2 * tokens}"
            " workload.host_ratio=1.0".split()
            + args.override
        )
        self.engine = e = pipeline.create_engine(job)
        size, source, self.tier = e.sizing.slots_per_page, list(range(n)), e.l3
        fill_random(e, source, 0)  # the same bytes, so the same objects, for every T
        self.keys = keys = e.l3_keys(range(n * size))
        if e.lookup(keys) < n:
            host = e.host_allocator.alloc(n)
            e.backup(page_tokens(host, size), page_tokens(source, size)).wait()
            e.write_back(keys, page_tokens(host, size)).wait()
            while e.acks.pending:
                e.poll()
            e.host_allocator.free(host)
        self.paths = [os.path.join(folder, self.tier.name(k)) for k in keys]
        self.sizes = [os.stat(path).st_size for path in self.paths]
        self.starts = np.cumsum([0, *self.sizes[:-1]]).tolist()
        self.units = [u.page_bytes for u in self.tier.object.units]
        self.files = np.concatenate([np.fromfile(path, np.uint8) for path in self.paths])
        self.buffer = np.zeros_like(self.files)
        self.view = self.buffer.data
        self.host, self.folder, self.threads = e.host_allocator.alloc(n), folder, threads
        self.mods, self.pool, self.repeats = mods, ThreadPoolExecutor(threads), args.repeats

    def shares(self, threads: int, ranges: int) -> list[Share]:
        found = []
        for k, objs in enumerate(np.array_split(np.arange(len(self.keys)), threads)):
            reads = []
            for i in objs.tolist():
                size, step, at = self.sizes[i], -(-self.sizes[i] // ranges), self.starts[i]
                reads += [(i, a, min(step, size - a), at + a) for a in range(0, size, step)]
            found.append(Share(k, objs.tolist(), reads, np.array(reads, np.uint64).reshape(-1, 4)))
        return found

    @contextlib.contextmanager
    def opened(self, objs: list[int]) -> Iterator[dict[int, int]]:
        fds: dict[int, int] = {}
        try:
            fds.update((i, os.open(self.paths[i], NOFOLLOW)) for i in objs)
            yield fds
        finally:
            for fd in fds.values():
                os.close(fd)


def preadv(p: Probe, s: Share) -> None:
    with p.opened(s.objs) as fds:
        for i, at, n, to in s.reads:
            os.preadv(fds[i], [p.view[to : to + n]], at)  # as the benches' limit: unchecked


def native(p: Probe, s: Share) -> None:
    """The file store's native call (`_fileio.read_objects`) on the share's own thread: every
    range of the share in one call, each range's CRC-32C taken as it lands."""
    t = s.table
    with p.opened(s.objs) as fds:
        at = t[:, 3] + np.uint64(p.buffer.ctypes.data)
        fd = np.array([fds[i] for i in s.objs], np.int32)
        objects = t[:, 0].astype(np.int64) - s.objs[0]  # a share's objects are consecutive
        sizes = np.array([p.sizes[i] for i in s.objs], np.int64)
        ranges = (t[:, 1].astype(np.int64), at, t[:, 2].astype(np.int64))
        crcs, ends = np.empty(len(t), np.uint32), np.array([len(t)], np.int64)
        _, done = read_objects(fd, sizes, False, objects, *ranges, crcs, ends, 1)
        if done < len(t):
            raise OSError("read_objects: a range came back short")


def store_read(p: Probe, s: Share) -> None:
    """The tier's read of the pages: one native call on the tier's I/O threads where it
    batches them (`pipeline.engine.l3.batch`), else a page at a time."""
    tier, units, keys = p.tier, p.tier.reads(False), [p.keys[i] for i in s.objs]
    if batched(tier, units, device=False):
        reader = tier.store.units_reader()
        assert reader is not None
        try:
            into = np.asarray(p.host)[s.objs]
            found = read_batch(tier, reader, units, keys, into, [[] for _ in keys])
        finally:
            reader.close()
    else:
        pages = [p.host[i] for i in s.objs]
        reads = (
            tier.read(k, i, units, device=False, table=[]) for k, i in zip(keys, pages, strict=True)
        )
        found = next((j for j, ok in enumerate(reads) if not ok), len(keys))
    if found < len(keys):
        raise RuntimeError(f"store-read: page {s.objs[found]} missed")


def uring(p: Probe, s: Share) -> None:
    lib = p.mods["liburing"]
    ring, cqes = lib.io_uring(), lib.io_uring_cqe()
    lib.io_uring_queue_init(1 << (len(s.reads) - 1).bit_length(), ring)  # completions: twice
    try:
        with p.opened(s.objs) as fds:
            for j, (i, at, n, to) in enumerate(s.reads):
                sqe = lib.io_uring_get_sqe(ring)
                lib.io_uring_prep_read(sqe, fds[i], p.view[to : to + n], n, at)
                sqe.user_data = j + 1
            lib.io_uring_submit_and_wait(ring, len(s.reads))  # one submit for every read
            lib.io_uring_wait_cqe(ring, cqes)  # cqes[j]: the j-th completion from the head
            ready = lib.io_uring_cq_ready(ring)
            bad = [j for j in range(ready) if cqes[j].res != s.reads[cqes[j].user_data - 1][2]]
            lib.io_uring_cq_advance(ring, ready)
        if bad or ready != len(s.reads):
            raise OSError(f"io_uring: {len(bad)} short reads, {ready} of {len(s.reads)} done")
    finally:
        lib.io_uring_queue_exit(ring)


def nixl(p: Probe, mode: str) -> Any:
    """An agent per thread, POSIX backend in `mode`: a transfer per thread on our descriptors."""
    lib, agents = p.mods["nixl_cu12"], []
    for k in range(p.threads):
        agents.append(lib.nixl_agent(f"probe-{mode}-{k}", lib.nixl_agent_config(backends=[])))
        agents[k].create_backend("POSIX", {mode: "true"})
        agents[k].register_memory([(p.buffer.ctypes.data, p.buffer.nbytes, 0, "")], "DRAM")

    def read(p: Probe, s: Share) -> None:
        agent, t = agents[s.k], s.table
        with p.opened(s.objs) as fds:
            fd_of = np.array([fds.get(i, 0) for i in range(len(p.sizes))], np.uint64)
            files = agent.get_xfer_descs(np.stack([t[:, 1], t[:, 2], fd_of[t[:, 0]]], 1), "FILE")
            at = t[:, 3] + np.uint64(p.buffer.ctypes.data)
            local = agent.get_xfer_descs(np.stack([at, t[:, 2], 0 * at], 1), "DRAM")
            held = agent.register_memory([(0, p.sizes[i], fds[i], "") for i in s.objs], "FILE")
            handle = agent.initialize_xfer("READ", local, files, agent.name)
            try:
                state = agent.transfer(handle)
                while state == "PROC":
                    state = agent.check_xfer_state(handle)
            finally:
                handle.release()
                agent.deregister_memory(held)
        if state != "DONE":
            raise OSError(f"nixl transfer: {state}")

    return read


def sglang(p: Probe) -> Any:
    """SGLang's HiCacheFile holding the same objects' bytes, read back into their places."""
    lib, slots = p.mods[HICACHE], [slice(a, a + n) for a, n in zip(p.starts, p.sizes, strict=True)]
    config = lib.HiCacheStorageConfig(0, 1, 0, 1, 0, 1, True, False, True, "probe")
    store = lib.HiCacheFile(config, file_path=os.path.join(p.folder, "sglang"))
    pages = [torch.from_numpy(p.buffer[slot]) for slot in slots]
    store.batch_set(p.keys, [torch.from_numpy(p.files[slot]) for slot in slots])

    def read(p: Probe, s: Share) -> None:
        if None in store.batch_get([p.keys[i] for i in s.objs], [pages[i] for i in s.objs]):
            raise RuntimeError("sglang: a page missed")

    return read


def crc(p: Probe, s: Share, per_unit: bool) -> None:
    """crc32c of each payload: a call per unit holding Python's lock (the tier's), or one."""
    ends = np.cumsum(p.units).tolist() if per_unit else [sum(p.units)]
    for i in s.objs:  # the payload ends its object
        at = p.starts[i] + p.sizes[i] - ends[-1]
        for a, b in zip([0, *ends[:-1]], ends, strict=True):
            crc32c.crc32c(p.view[at + a : at + b], gil_release_mode=0 if per_unit else -1)


def copy(p: Probe, s: Share) -> None:
    """One copy of the objects' bytes in memory (torch's, as the load's host-to-device copy
    on a CPU rank): what the issue's bar adds to SGLang's read."""
    for i in s.objs:
        at = slice(p.starts[i], p.starts[i] + p.sizes[i])
        torch.from_numpy(p.buffer[at]).copy_(torch.from_numpy(p.files[at]))


def load_from_l3(p: Probe, s: Share) -> None:
    e, n = p.engine, len(p.keys)
    size, fresh, target = e.sizing.slots_per_page, e.host_allocator.alloc(n), range(n, 2 * n)
    e.lookup(p.keys)
    load = e.load_from_l3(p.keys, page_tokens(fresh, size), page_tokens(list(target), size))
    if load.handle is not None:
        load.handle.done(e.runtime.forward_stream).wait()
    while e.acks.pending:
        e.poll()
    e.host_allocator.free(fresh)  # a failed load leaves its pages taken: the row says why
    if load.hits != n:
        raise RuntimeError(f"load_from_l3: {load.hits} of {n} pages")


def module(name: str, sites: list[str]) -> tuple[Any, str]:
    """The package and its version; (None, why) where it is missing or its smoke test fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sites, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", SMOKE[name]], env=env, capture_output=True)
    if child.returncode:  # what it printed last, or the signal that killed it
        why = child.stderr.decode().strip().splitlines() or [f"signal {-child.returncode}"]
        return None, why[-1][:200]
    dist_name = name.split(".")[0].replace("_", "-")  # nixl_cu12: nixl-cu12
    return importlib.import_module(name), importlib.metadata.version(dist_name)


def prepared(p: Probe, row: dict[str, Any], make: Any, shares: list[Share], check: str) -> Any:
    """The candidate's load, checked once into the zeroed buffer (None where it failed)."""
    p.buffer[:] = 0
    try:
        fn = make(p)
        list(p.pool.map(lambda s: fn(p, s), shares))
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[:200]
        return None
    row["checked"] = bool(np.array_equal(p.buffer, p.files)) if check == "files" else check
    return lambda: list(p.pool.map(lambda s: fn(p, s), shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, default in SIZES.items():
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ranges", type=int, nargs="+", default=[1, 61], help="per object")
    parser.add_argument("--site", action="append", default=[], help="a folder to import from")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--override", nargs="*", default=[], help="config overrides")
    args = parser.parse_args()
    sys.path[:0] = args.site
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    packages = {name: module(name, args.site) for name in SMOKE}
    mods = {name: mod for name, (mod, _) in packages.items() if mod is not None}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="probe-reads-") as folder:
        for threads in args.threads:
            p, loads = Probe(args, threads, folder, mods), []
            for name, package, make, ranged, check in CANDIDATES:
                mod, version = packages.get(package, (None, ""))
                for ranges in args.ranges if ranged else [1]:
                    row = dict(candidate=name, version=version, threads=threads, ranges=ranges)
                    rows.append(row)
                    if package and mod is None:
                        row["error"] = version
                        continue
                    alone = name in ("load_from_l3", "store-read")  # threads of their own
                    shares = p.shares(1 if alone else threads, ranges)
                    loads.append((row, prepared(p, row, make, shares, check)))
            for _ in range(args.repeats):  # the candidates in turn: the machine's load hits each
                for row, load in (x for x in loads if x[1] is not None):
                    began = time.perf_counter()
                    load()
                    row.setdefault("seconds", []).append(time.perf_counter() - began)
            p.engine.close()
    report(rows, sum(p.sizes), args.json)


def report(rows: list[dict[str, Any]], nbytes: int, path: str | None) -> None:
    """Each row's median, GB/s and share of the read limit (preadv of whole objects, same T)."""
    print("| candidate | version | T | R | ms | GB/s | x read limit | checked | error |")
    limit = {r["threads"]: r for r in rows if r["candidate"] == "preadv" and r["ranges"] == 1}
    for row in rows:  # the limit's row comes first among its T's
        if "seconds" in row:
            row["median_ms"] = float(np.median(row["seconds"])) * 1e3
            row["gbps"] = nbytes / row["median_ms"] / 1e6
            row["x_limit"] = row["gbps"] / limit[row["threads"]].get("gbps", np.nan)
        cells = [row[k] for k in ("candidate", "version", "threads", "ranges")]
        cells += [f"{row[k]:.2f}" if k in row else "" for k in ("median_ms", "gbps", "x_limit")]
        cells += [row.get("checked", ""), row.get("error", "")]
        print("| " + " | ".join(map(str, cells)) + " |")
    for t in sorted({r["threads"] for r in rows}):
        by = {r["candidate"]: r["median_ms"] for r in rows if r["threads"] == t and "seconds" in r}
        if {"sglang", "copy", "load_from_l3"} <= by.keys():
            bar = by["sglang"] + by["copy"]
            print(
                f"T={t}: load_from_l3 {by['load_from_l3']:.1f} ms against SGLang's read plus "
                f"one copy {bar:.1f} ms: x {by['load_from_l3'] / bar:.2f}"
            )
    if path:
        with open(path, "w") as f:
            json.dump({"machine": str(os.uname()), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
