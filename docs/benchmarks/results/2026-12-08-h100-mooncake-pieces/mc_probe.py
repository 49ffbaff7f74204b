"""Mooncake: read_units of 256 deepseek-sized pages, pieces vs one object a page, vs raw."""

import cProfile
import pstats
import sys
import time

import numpy as np

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import UnitReads, open_store
from pipeline.jobs.l3_store import concrete

PAGES, UNITS, UNIT, HEAD = int(sys.argv[1]) if len(sys.argv) > 1 else 128, 61, 73728, 2560
PAYLOAD = UNITS * UNIT
SIZE = HEAD + PAYLOAD
starts = range(1, UNITS, 8)
cuts = [s * UNIT for s in starts]


def reads(pool, heads, space, groups):
    objects, offsets, addresses, nbytes, ends = [], [], [], [], []
    for units in groups:
        for k in range(PAGES):
            if units[0] == 0:
                objects.append(k)
                offsets.append(0)
                addresses.append(heads.ctypes.data + k * HEAD)
                nbytes.append(HEAD)
            for u in units:
                objects.append(k)
                offsets.append(HEAD + u * UNIT)
                addresses.append(pool.ctypes.data + (k * UNITS + u) * UNIT)
                nbytes.append(UNIT)
        ends.append(len(objects))
    return UnitReads(
        [f"{space}/ab/p{k}" for k in range(PAGES)],
        [SIZE] * PAGES,
        np.array(objects, np.int64),
        np.array(offsets, np.int64),
        np.array(addresses, np.uint64),
        np.array(nbytes, np.int64),
        np.zeros(len(objects), np.uint32),
        starts=True,
        ends=np.array(ends, np.int64),
        threads=4,
    )


with concrete(
    StorageConfig(kind=StorageKind.mooncake, segment_bytes=int(PAGES * SIZE * 2.6))
) as storage:
    store = open_store(storage, SIZE)
    store.cut("cut", PAYLOAD, cuts)
    pool = np.random.default_rng(0).integers(0, 256, PAGES * PAYLOAD, np.uint8)
    heads = np.zeros(PAGES * HEAD, np.uint8)
    store.register([pool.data])
    w = store.units_writer()
    for space in ("flat", "cut"):
        objs = [
            (f"{space}/ab/p{k}", [bytes(HEAD), memoryview(pool[k * PAYLOAD : (k + 1) * PAYLOAD])])
            for k in range(PAGES)
        ]
        t = time.perf_counter()
        w.put_many(objs)
        print(space, "put_many", round((time.perf_counter() - t) * 1e3, 1), "ms")
    one = [list(range(UNITS))]
    grouped = [[0]] + [list(range(s, min(s + 8, UNITS))) for s in starts]
    for space, groups, label in [
        ("flat", one, "whole"),
        ("cut", one, "pieces, one group"),
        ("cut", grouped, "pieces, 9 groups"),
    ]:
        r = store.units_reader()
        best = min(
            (
                lambda: (
                    t := time.perf_counter(),
                    r.read_units(reads(pool, heads, space, groups)),
                    time.perf_counter() - t,
                )
            )()[2]
            for _ in range(3)
        )
        print(f"{label:20s} {best * 1e3:7.1f} ms")
        if label == "pieces, one group" and "-p" in sys.argv:
            cProfile.run("r.read_units(reads(pool, heads, space, groups))", "/tmp/probe/prof")
            pstats.Stats("/tmp/probe/prof").sort_stats("cumtime").print_stats(18)
        r.close()
    buf = np.empty(PAGES * SIZE, np.uint8)
    store.client.register_buffer(buf.ctypes.data, buf.nbytes)
    for space in ("flat", "cut"):
        names = [n for k in range(PAGES) for n in store.pieces.names(f"{space}/ab/p{k}")]
        b = store.pieces.of(f"{space}/ab/p0", SIZE) or (0, SIZE)
        ptrs = [buf.ctypes.data + k * SIZE + a for k in range(PAGES) for a in b[:-1]]
        lens = np.diff(b).tolist() * PAGES
        best = min(
            (
                lambda: (
                    t := time.perf_counter(),
                    store.client.batch_get_into(names, ptrs, lens),
                    time.perf_counter() - t,
                )
            )()[2]
            for _ in range(3)
        )
        print(f"raw {space:16s} {best * 1e3:7.1f} ms")
        mp = [[p] for p in ptrs]
        ml = [[n] for n in lens]
        best = min(
            (
                lambda: (
                    t := time.perf_counter(),
                    store.client.batch_get_into_multi_buffers(names, mp, ml),
                    time.perf_counter() - t,
                )
            )()[2]
            for _ in range(3)
        )
        print(f"raw multi {space:10s} {best * 1e3:7.1f} ms")
    store.client.unregister_buffer(buf.ctypes.data)
    store.unregister([pool.data])
    store.close()
