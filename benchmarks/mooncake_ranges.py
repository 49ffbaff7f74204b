"""Mooncake's whole-object gets against its ranged gets, on the same objects and memory.

N objects of a deepseek_v3 page's size (61 units of 72 KiB) put in a Mooncake master this
starts on loopback, then read back into one registered buffer five times each way, the best
and the median printed: whole objects in one `batch_get_into_multi_buffers`; the same bytes
as one ranged get through a get session (`batch_get_into_multi_buffer_ranges`), and as 8
groups of layers that way (a streamed load's reads); and without a session
(`get_into_ranges`). Every way's bytes are checked. From the root:
    python benchmarks/mooncake_ranges.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import open_store
from pipeline.jobs.l3_store import concrete

SIZE = 61 * 73728


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=128)
    parser.add_argument("--groups", type=int, default=8)
    args = parser.parse_args()
    n, groups = args.objects, args.groups
    with concrete(StorageConfig(kind=StorageKind.mooncake, segment_bytes=2 << 30)) as storage:
        store = open_store(storage, 4096)
        client = store.client  # type: ignore[attr-defined]
        source = np.random.default_rng(1).integers(0, 256, n * SIZE, np.uint8)
        into = np.zeros_like(source)
        store.register([source.data, into.data])
        names = [f"ns/page{i}" for i in range(n)]
        at = [source.ctypes.data + i * SIZE for i in range(n)]
        codes = client.batch_put_from_multi_buffers(names, [[a] for a in at], [[SIZE]] * n)
        assert not any(codes), codes
        base = [into.ctypes.data + i * SIZE for i in range(n)]

        def whole() -> None:
            got = client.batch_get_into_multi_buffers(names, [[b] for b in base], [[SIZE]] * n)
            assert all(g == SIZE for g in got), got[:3]

        def session(parts: int) -> None:
            step = SIZE // parts
            client.batch_get_session_start(names)
            for g in range(parts):
                ptrs, offsets = [[b + g * step] for b in base], [[g * step]] * n
                got = client.batch_get_into_multi_buffer_ranges(names, ptrs, [[step]] * n, offsets)
                assert all(x == step for x in got), got[:3]
            client.batch_get_session_end(names)

        def sessionless(parts: int) -> None:
            step = SIZE // parts
            for g in range(parts):
                counts = client.get_into_ranges(
                    [b + g * step for b in base],
                    [[name] for name in names],
                    [[[0]]] * n,
                    [[[g * step]]] * n,
                    [[[step]]] * n,
                )
                assert all(c[0][0] == step for c in counts), counts[:2]

        ways: list[tuple[str, Callable[[], None]]] = [
            ("whole objects, batch_get_into_multi_buffers", whole),
            ("one range each, session", lambda: session(1)),
            (f"{groups} groups, session", lambda: session(groups)),
            ("one range each, get_into_ranges", lambda: sessionless(1)),
            (f"{groups} groups, get_into_ranges", lambda: sessionless(groups)),
        ]
        print(f"{n} objects of {SIZE} B ({n * SIZE / 1e6:.1f} MB)")
        for name, way in ways:
            into[:] = 0
            seconds = []
            for _ in range(5):
                began = time.perf_counter()
                way()
                seconds.append(time.perf_counter() - began)
            assert np.array_equal(into, source), name
            best, median = min(seconds) * 1e3, statistics.median(seconds) * 1e3
            print(f"{name:45s} best {best:7.1f} ms  median {median:7.1f} ms", flush=True)
        store.unregister([source.data, into.data])
        store.close()


if __name__ == "__main__":
    main()
