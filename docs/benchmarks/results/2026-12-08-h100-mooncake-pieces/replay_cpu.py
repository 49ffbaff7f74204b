"""Replay each client call the store's `read_units` made in `benchmarks/mooncake_pieces.py`:
as made, into one registered block instead (the object's own layout), with the headers moved
out of staging, and into a fresh copy of the pool (the pool's layout, other memory) SHIFT
bytes past its start. Run from a checkout of the tree before the pieces' pad (`2ffbf6a`):

    PYTHONPATH=$PWD python replay_cpu.py [SHIFT]
"""

import sys
import time
from typing import Any

import numpy as np

from pipeline.engine.l3.stores import mooncake_units

sys.path.insert(0, "benchmarks")
import mooncake_pieces

SEEN: list[tuple[Any, ...]] = []
ORIGINAL_WHOLE = mooncake_units.MooncakeUnits._whole
ORIGINAL_BEST = mooncake_pieces.best_ms


def whole(self: Any, names: list[str], parts: list[Any]) -> list[int]:
    began = time.perf_counter()
    got = ORIGINAL_WHOLE(self, names, parts)
    ptrs, lengths = [p for p, _, _ in parts], [n for _, n, _ in parts]
    SEEN.append((names, ptrs, lengths, time.perf_counter() - began, self))
    return got


def timed(call: Any, *args: Any) -> float:
    began = time.perf_counter()
    call(*args)
    return (time.perf_counter() - began) * 1e3


POOL_BYTES = 128 * 61 * 73728
SHIFT = int(sys.argv[1]) if len(sys.argv) > 1 else 0


def copied(ptrs: list[list[int]], pool: int, copy: np.ndarray) -> list[list[int]]:
    """`ptrs` with every address in the pool (from `pool` on) moved into `copy`."""
    inside = range(pool, pool + POOL_BYTES)
    at = copy.ctypes.data + SHIFT
    return [[a - pool + at if a in inside else a for a in p] for p in ptrs]


def replay(
    names: list[str], ptrs: list[list[int]], lengths: list[list[int]], reader: Any, pool: int
) -> None:
    get = reader.client.batch_get_into_multi_buffers
    copy = np.empty(POOL_BYTES + SHIFT, np.uint8)
    reader.client.register_buffer(copy.ctypes.data, copy.nbytes)
    elsewhere = copied(ptrs, pool, copy)
    get(names, elsewhere, lengths)  # the copy's pages touched once
    took = timed(get, names, elsewhere, lengths)
    print(f"  the pool's layout in other memory, {SHIFT} B on: {took:.1f} ms")
    reader.client.unregister_buffer(copy.ctypes.data)
    block = np.empty(sum(sum(n) for n in lengths), np.uint8)
    reader.client.register_buffer(block.ctypes.data, block.nbytes)
    ends = np.cumsum([n for each in lengths for n in each]).tolist()
    starts = iter([0, *ends[:-1]])
    moved = [[block.ctypes.data + next(starts) for _ in each] for each in lengths]
    heads = [
        [block.ctypes.data + 4096 * i, *p[1:]] if len(p) == 2 else p for i, p in enumerate(ptrs)
    ]
    get(names, moved, lengths)  # the block's pages touched once
    print(
        f"  replayed {timed(get, names, ptrs, lengths):.1f} ms, into one block "
        f"{timed(get, names, moved, lengths):.1f}, headers out of staging "
        f"{timed(get, names, heads, lengths):.1f}"
    )
    reader.client.unregister_buffer(block.ctypes.data)


def best(repeats: int, run: Any) -> float:
    SEEN.clear()
    found = ORIGINAL_BEST(repeats, run)
    if SEEN:  # the store's read: its last run's calls, one a window
        calls = SEEN[-2:]
        print("store calls ms", [round(c[3] * 1e3, 1) for c in calls], [len(c[0]) for c in calls])
        pool = calls[0][1][0][1]  # page 0's unit 0: the pool's first byte
        for names, ptrs, lengths, _, reader in calls:
            replay(names, ptrs, lengths, reader, pool)
    return found


mooncake_units.MooncakeUnits._whole = whole  # type: ignore[method-assign]
mooncake_pieces.best_ms = best
sys.argv = ["mooncake_pieces.py", "--pages", "128", "--repeats", "3"]
mooncake_pieces.main()
