"""A parts reader's span reads: one range of each of many objects, each checked by its CRC."""

from __future__ import annotations

import crc32c
import numpy as np
import pytest

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import SpanReads, open_store
from pipeline.jobs.l3_store import concrete

PAGE = 4096


@pytest.mark.parametrize(
    "kind", [StorageKind.file, pytest.param(StorageKind.mooncake, marks=pytest.mark.mooncake)]
)
def test_span_reads_land_checked_and_stop_at_the_first_miss(kind: StorageKind) -> None:
    """Each span lands in its buffer and is counted only if its object is there, has the
    size the read names, and the range's bytes have the CRC given; the reader stops at the
    first that does not. The file store's reader reads an object replaced after its first
    read as it was opened, until it is closed."""
    with concrete(StorageConfig(kind=kind, segment_bytes=64 << 20)) as storage:
        store = open_store(storage, 1 << 20)
        try:
            for k in range(4):
                store.put(f"ns/ab/k{k}", [memoryview(bytes([k * 10 + i]) * PAGE) for i in range(8)])
            pool = np.zeros(4 * PAGE, dtype=np.uint8)
            views = [pool.data[k * PAGE : (k + 1) * PAGE] for k in range(4)]
            crcs = [crc32c.crc32c(bytes([k * 10 + 5]) * PAGE) for k in range(4)]

            def spans(
                keys: list[int], *, names: dict[int, str] | None = None, size: int = 8 * PAGE
            ) -> SpanReads:
                named = [(names or {}).get(k, f"ns/ab/k{k}") for k in keys]
                return SpanReads(
                    named,
                    [size] * len(keys),
                    [5 * PAGE] * len(keys),
                    [views[k] for k in keys],
                    [crcs[k] for k in keys],
                )

            reader = store.parts_reader()
            assert reader.read_spans(spans([0, 1, 2, 3])) == 4
            assert [int(pool[k * PAGE]) for k in range(4)] == [5, 15, 25, 35]
            assert reader.read_spans(spans([0, 1, 2], names={1: "ns/ab/none"})) == 1
            assert reader.read_spans(spans([0, 1], size=9 * PAGE)) == 0  # another length
            crcs[2] ^= 1  # a range whose bytes are not what its header said
            assert reader.read_spans(spans([0, 1, 2, 3])) == 2
            crcs[2] ^= 1
            assert reader.read_spans(spans([])) == 0
            if kind is StorageKind.file:
                store.put("ns/ab/k0", [memoryview(bytes([99]) * PAGE) for _ in range(8)])
                assert reader.read_spans(spans([0])) == 1 and int(pool[0]) == 5  # as opened
                reader.close()
                reader = store.parts_reader()
                assert reader.read_spans(spans([0])) == 0 and int(pool[0]) == 99  # its CRC fails
            reader.close()
        finally:
            store.close()
