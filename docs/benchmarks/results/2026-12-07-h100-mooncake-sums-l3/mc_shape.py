# Mooncake: the raw loop's get against the shapes a load's gets take (scatter, windows)
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import open_store
from pipeline.engine.l3.stores._fileio import crcs_at
from pipeline.jobs.l3_store import concrete

HEAD, PAY = 1536, 61 * 73728
SIZE = HEAD + PAY
n, win, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=8 << 30)) as storage:
    store = open_store(storage, 4096)
    client = store.client
    source = np.random.default_rng(1).integers(0, 256, n * SIZE, np.uint8)
    into = np.zeros_like(source)
    heads = np.zeros(n * HEAD, np.uint8)
    store.register([source.data, into.data, heads.data])
    names = [f"ns/page{i}" for i in range(n)]
    assert not any(
        client.batch_put_from_multi_buffers(
            names, [[source.ctypes.data + i * SIZE] for i in range(n)], [[SIZE]] * n
        )
    )
    base = [into.ctypes.data + i * SIZE for i in range(n)]
    pays = [into.ctypes.data + i * PAY for i in range(n)]
    hb = [heads.ctypes.data + i * HEAD for i in range(n)]
    addrs = np.array([a for i in range(n) for a in (hb[i], pays[i])], np.uint64)
    lens = np.array([HEAD, PAY] * n, np.int64)
    crcs = np.zeros(2 * n, np.uint32)
    pool = ThreadPoolExecutor(1)

    def raw():
        got = client.batch_get_into(names, base, [SIZE] * n)
        assert all(g == SIZE for g in got)

    def get(s):
        got = client.batch_get_into_multi_buffers(
            names[s],
            [[hb[i], pays[i]] for i in range(s.start, s.stop)],
            [[HEAD, PAY]] * (s.stop - s.start),
        )
        assert all(g == SIZE for g in got)

    def crc(s):
        crcs_at(
            addrs[2 * s.start : 2 * s.stop],
            lens[2 * s.start : 2 * s.stop],
            crcs[2 * s.start : 2 * s.stop],
            threads,
        )

    wins = [slice(i, min(i + win, n)) for i in range(0, n, win)]

    def scatter_one():
        get(slice(0, n))

    def windows():
        for s in wins:
            get(s)

    def windows_crc():
        for s in wins:
            get(s)
            crc(s)

    def overlapped():
        pending = None
        for s in wins:
            f = pool.submit(get, s)
            if pending is not None:
                crc(pending)
            f.result()
            pending = s
        crc(pending)

    def crc_only():
        crc(slice(0, n))

    for name, way in (
        ("raw batch_get_into", raw),
        ("scatter, one call", scatter_one),
        (f"windows of {win}", windows),
        (f"windows + crc ({threads} thr)", windows_crc),
        ("windows, crc overlapped", overlapped),
        ("crc alone", crc_only),
        ("raw batch_get_into", raw),
    ):
        s = []
        for _ in range(7):
            t = time.perf_counter()
            way()
            s.append(time.perf_counter() - t)
        print(
            f"{name:34s} best {min(s) * 1e3:7.1f} median {statistics.median(s) * 1e3:7.1f} ms",
            flush=True,
        )
    store.unregister([source.data, into.data, heads.data])
    store.close()
