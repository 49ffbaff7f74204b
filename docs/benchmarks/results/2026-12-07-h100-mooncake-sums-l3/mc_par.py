# Mooncake on this host: whole-object gets against group objects and ranged gets,
# in one call or in threads: python mc_par.py OBJECTS GROUPS THREADS
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import open_store
from pipeline.jobs.l3_store import concrete

SIZE = 61 * 73728
n, groups, par = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=8 << 30)) as storage:
    store = open_store(storage, 4096)
    client = store.client
    source = np.random.default_rng(1).integers(0, 256, n * SIZE, np.uint8)
    into = np.zeros_like(source)
    store.register([source.data, into.data])
    names = [f"ns/page{i}" for i in range(n)]
    at = [source.ctypes.data + i * SIZE for i in range(n)]
    assert not any(client.batch_put_from_multi_buffers(names, [[a] for a in at], [[SIZE]] * n))
    step = SIZE // groups
    gnames = [[f"ns/page{i}/g{g}" for i in range(n)] for g in range(groups)]
    for g in range(groups):
        assert not any(
            client.batch_put_from_multi_buffers(
                gnames[g], [[a + g * step] for a in at], [[step]] * n
            )
        )
    base = [into.ctypes.data + i * SIZE for i in range(n)]
    pool = ThreadPoolExecutor(par)

    def whole():
        got = client.batch_get_into_multi_buffers(names, [[b] for b in base], [[SIZE]] * n)
        assert all(x == SIZE for x in got)

    def whole_par():
        k = -(-n // par)

        def part(j):
            s = slice(j * k, (j + 1) * k)
            return client.batch_get_into_multi_buffers(
                names[s], [[b] for b in base[s]], [[SIZE]] * len(names[s])
            )

        for got in pool.map(part, range(par)):
            assert all(x == SIZE for x in got)

    def gpart(g):
        return client.batch_get_into_multi_buffers(
            gnames[g], [[b + g * step] for b in base], [[step]] * n
        )

    def grouped():
        for g in range(groups):
            assert all(x == step for x in gpart(g))

    def grouped_par():
        for got in pool.map(gpart, range(groups)):
            assert all(x == step for x in got)

    def rpart(g):
        return client.batch_get_into_multi_buffer_ranges(
            names, [[b + g * step] for b in base], [[step]] * n, [[g * step]] * n
        )

    def ranged():
        client.batch_get_session_start(names)
        for g in range(groups):
            assert all(x == step for x in rpart(g))
        client.batch_get_session_end(names)

    def ranged_par():
        client.batch_get_session_start(names)
        for got in pool.map(rpart, range(groups)):
            assert all(x == step for x in got)
        client.batch_get_session_end(names)

    ways = (
        ("whole, one call", whole),
        (f"whole, {par} threads", whole_par),
        (f"{groups} group objects, a call each", grouped),
        (f"{groups} group objects, {par} threads", grouped_par),
        (f"{groups} ranged groups, session", ranged),
        (f"{groups} ranged groups, {par} threads", ranged_par),
        ("whole, one call", whole),
    )
    print(f"{n} objects of {SIZE} B, {n * SIZE / 1e9:.2f} GB", flush=True)
    for name, way in ways:
        into[:] = 0
        s = []
        for _ in range(7):
            t = time.perf_counter()
            way()
            s.append(time.perf_counter() - t)
        assert np.array_equal(into, source), name
        print(
            f"{name:40s} best {min(s) * 1e3:7.1f} median {statistics.median(s) * 1e3:7.1f} ms "
            f"({n * SIZE / statistics.median(s) / 1e9:.1f} GB/s)",
            flush=True,
        )
    store.unregister([source.data, into.data])
    store.close()
