"""Where Mooncake loads of objects kept as a piece a layer group lose time, side by side with
one object a page, on a master this script starts (a probe; issue 65).

PAGES deepseek_v3-sized pages (61 units of 73,728 B and a 2,560 B header) are written twice,
once one object a page ("whole") and once in 9 pieces a page ("pieces", cut as
`storage.stream_layers=8` cuts them), then read back, best of `--repeats`, in ms:

- `store`: the store's `read_units`, windows of `--window` pages in one call in turn (as a
  windowed load reads them: a client call and the CRCs per window);
- `raw`: the client's `batch_get_into` of every object in one call, one buffer each;
- `raw_multi`: `batch_get_into_multi_buffers`, one call, one buffer each;
- `raw_windows`: `batch_get_into_multi_buffers` a window at a time, as the store calls it;
  `raw_windows_split` with each header a buffer of its own (as the store lands it), and
  `raw_windows_bounded` so, on the store's bounded worker threads (`mooncake_calls`).

What `store` takes beyond `raw_windows_bounded` is the store's own: the CRC-32Cs and its
Python a piece.

    python benchmarks/mooncake_pieces.py --pages 256 --window 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.groups import group_starts
from pipeline.engine.l3.stores import MooncakeStore, UnitReads, open_store
from pipeline.jobs.l3_store import concrete

UNITS, UNIT, HEAD = 61, 73728, 2560
PAYLOAD, SIZE = UNITS * UNIT, HEAD + UNITS * UNIT


def best_ms(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return round(min(times) * 1e3, 1)


def unit_reads(names: list[str], pool: np.ndarray, heads: np.ndarray, window: int) -> UnitReads:
    """Every page's header and units, in windows of `window` pages."""
    pages = len(names)
    objects = np.repeat(np.arange(pages), UNITS + 1)
    offsets = np.tile([0, *(HEAD + u * UNIT for u in range(UNITS))], pages)
    units = pool.ctypes.data + (np.arange(pages)[:, None] * UNITS + np.arange(UNITS)) * UNIT
    addresses = np.concatenate([heads.ctypes.data + np.arange(pages)[:, None] * HEAD, units], 1)
    nbytes = np.tile([HEAD, *[UNIT] * UNITS], pages)
    ends = np.minimum(np.arange(window, pages + window, window), pages) * (UNITS + 1)
    return UnitReads(
        names, [SIZE] * pages, objects, offsets.astype(np.int64),
        addresses.ravel().astype(np.uint64), nbytes.astype(np.int64),
        np.zeros(len(objects), np.uint32), starts=True, ends=ends.astype(np.int64), threads=4,
    )  # fmt: skip


def raw(store: MooncakeStore, names: list[str], buffer: np.ndarray, window: int) -> dict:
    """The client's own gets of every Mooncake object `names` are kept as, into `buffer`."""
    lengths = store.pieces.sizes(names[0], SIZE)  # a page's objects, as the store keeps them
    kept = [piece for name in names for piece in store.pieces.names(name)]
    per, stride = len(lengths), sum(lengths)
    firsts = np.cumsum([0, *lengths[:-1]]).tolist()
    ptrs = [buffer.ctypes.data + p * stride + at for p in range(len(names)) for at in firsts]
    sizes = lengths * len(names)
    client, step = store.client, window * per

    def windows() -> None:
        for at in range(0, len(kept), step):
            got = client.batch_get_into_multi_buffers(
                kept[at : at + step],
                [[p] for p in ptrs[at : at + step]],
                [[n] for n in sizes[at : at + step]],
            )
            assert list(got) == sizes[at : at + step]

    def split(at: int, stop: int) -> tuple[list[list[int]], list[list[int]]]:
        """Each object's first HEAD bytes as a buffer of their own (as the store lands a
        header apart from its units)."""
        first = [k % per == 0 for k in range(at, stop)]
        return (
            [[p, p + HEAD] if f else [p] for p, f in zip(ptrs[at:stop], first, strict=True)],
            [[HEAD, n - HEAD] if f else [n] for n, f in zip(sizes[at:stop], first, strict=True)],
        )

    def windows_split() -> None:
        for at in range(0, len(kept), step):
            stop = min(at + step, len(kept))
            got = client.batch_get_into_multi_buffers(kept[at:stop], *split(at, stop))
            assert list(got) == sizes[at:stop]

    def windows_bounded() -> None:  # each call on the store's bounded worker threads
        for at in range(0, len(kept), step):
            stop = min(at + step, len(kept))
            got = store.call(client.batch_get_into_multi_buffers, kept[at:stop], *split(at, stop))
            assert list(got) == sizes[at:stop]

    return {
        "raw_windows_bounded": windows_bounded,
        "raw_windows_split": windows_split,
        "raw": lambda: client.batch_get_into(kept, ptrs, sizes),
        "raw_multi": lambda: client.batch_get_into_multi_buffers(
            kept, [[p] for p in ptrs], [[n] for n in sizes]
        ),
        "raw_windows": windows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=256)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    pages = args.pages
    storage = StorageConfig(kind=StorageKind.mooncake, segment_bytes=int(pages * SIZE * 2.6))
    found: dict[str, dict[str, float]] = {}
    with concrete(storage) as config:
        store = open_store(config, SIZE)
        assert isinstance(store, MooncakeStore)
        # one unit a layer: the pieces start where 8-layer groups do (`l3.groups.piece_cuts`)
        store.cut("pieces", PAYLOAD, [s * UNIT for s in group_starts(UNITS, 8)])
        pool = np.random.default_rng(0).integers(0, 256, pages * PAYLOAD, np.uint8)
        heads = np.zeros(pages * HEAD, np.uint8)
        buffer = np.empty(pages * (SIZE + 9 * 64), np.uint8)  # pieces with their pads
        store.register([pool.data, buffer.data])
        writer = store.units_writer()
        for space in ("whole", "pieces"):
            names = [f"{space}/ab/p{k}" for k in range(pages)]
            objects = [
                (name, [bytes(HEAD), memoryview(pool[k * PAYLOAD : (k + 1) * PAYLOAD])])
                for k, name in enumerate(names)
            ]
            found[space] = {"put": best_ms(1, lambda objects=objects: writer.put_many(objects))}
            reader = store.units_reader()
            reads = unit_reads(names, pool, heads, args.window)
            found[space]["store"] = best_ms(args.repeats, lambda: reader.read_units(reads))  # noqa: B023
            reader.close()
            for label, run in raw(store, names, buffer, args.window).items():
                found[space][label] = best_ms(args.repeats, run)
        store.unregister([pool.data, buffer.data])
        store.close()
    for space, times in found.items():
        print(f"{space:7s}", "  ".join(f"{k} {v:7.1f}" for k, v in times.items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"pages": pages, "window": args.window, "ms": found}, out, indent=1)


if __name__ == "__main__":
    main()
