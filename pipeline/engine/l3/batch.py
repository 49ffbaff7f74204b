"""A run of pages read in one store call (`UnitsReader.read_units`): each page's units straight
into its host-pool rows, each unit's CRC-32C taken natively as it lands, every header read in
the same call where the digest tables are not known yet; the digests are compared after, in
bulk, and only the headers' own checks take a Python step per page.

Taken where the host pool holds each unit's page as bytes (host layouts layer_first and
page_first_direct), the check is CRC-32C (a keyed check is a digest per unit in Python) and the
store reads natively (a file store through the page cache); elsewhere a page is a read of its
own (`L3Tier.read`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from pipeline.core.l3_rows import header_rows
from pipeline.core.model import Unit
from pipeline.engine.l3.stores import UnitReads, UnitsReader
from pipeline.engine.l3.tier import L3Tier


def batched(tier: L3Tier, units: tuple[Unit, ...], *, device: bool) -> bool:
    """Whether reads of `units` into the host pool (not `device` pages) go in batches."""
    return (
        not device
        and tier.reads_units
        and tier.runs_crc is not None
        and tier.page_map(units, device=False).direct
    )


def start_batches(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: list[str],
    into: np.ndarray,
    tables: list[list[int]],
) -> list[Future[bool]]:
    """Read the pages `into` in runs, a task each on the I/O threads in page order (each
    window of the fetch split across the threads); a future per page, True once it is read
    intact. A run any of whose futures was cancelled (a drained fetch) reads nothing."""
    count = len(keys)
    per_run = max(1, -(-min(tier.window_pages or count, count) // tier.storage.io_threads))
    futures: list[Future[bool]] = [Future() for _ in keys]
    for first in range(0, count, per_run):
        run = slice(first, min(first + per_run, count))
        tier.io.submit(_run, tier, units, keys[run], into[run], tables[run], futures[run])
    return futures


def _run(
    tier: L3Tier,
    units: tuple[Unit, ...],
    keys: list[str],
    into: np.ndarray,
    tables: list[list[int]],
    futures: list[Future[bool]],
) -> None:
    running = [future for future in futures if future.set_running_or_notify_cancel()]
    found = 0
    try:
        if len(running) == len(futures):
            reader = tier.store.units_reader()
            assert reader is not None, "batched() asked the store"
            try:
                found = read_batch(tier, reader, units, keys, into, tables)
            finally:
                reader.close()
    except BaseException as e:
        for future in running:
            future.set_exception(e)
        return
    for i, future in enumerate(running):
        future.set_result(i < found)


def read_batch(
    tier: L3Tier,
    reader: UnitsReader,
    units: tuple[Unit, ...],
    keys: Sequence[str],
    into: np.ndarray,
    tables: Sequence[list[int]],
) -> int:
    """`units` of the objects of `keys` read into host pages `into` in one `reader` call, each
    checked against its page's digest table: read from its header into an empty `tables[i]`,
    or known (every table filled: a streamed load's later group); how many pages, from the
    first, were read intact. A page there that fails its check counts as `l3_corrupt`."""
    obj, pages, count = tier.object, tier.page_map(units, device=False), len(keys)
    names = [tier.name(key) for key in keys]
    heads = np.array([obj.header_size(tier.space, n, tier.checks) for n in names], np.int64)
    known = count > 0 and bool(tables[0])
    skip = 0 if known else 1  # the header's range, before the units'
    per = len(units) + skip
    offsets, addresses = np.empty((count, per), np.int64), np.empty((count, per), np.uint64)
    nbytes, crcs = np.empty((count, per), np.int64), np.empty((count, per), np.uint32)
    offsets[:, skip:] = heads[:, None] + np.asarray(pages.payload, np.int64)
    addresses[:, skip:] = pages.first + np.asarray(into, np.uint64)[:, None] * pages.stride
    nbytes[:, skip:] = pages.nbytes
    width = int(heads.max()) if count else 0
    head_rows = np.empty((count, width), np.uint8)  # kept alive until the read returns
    if not known:
        offsets[:, 0] = 0
        addresses[:, 0] = head_rows.ctypes.data + np.arange(count, dtype=np.uint64) * width
        nbytes[:, 0] = heads
    sizes = (heads + obj.page_bytes).tolist()
    columns = (offsets.ravel(), addresses.ravel(), nbytes.ravel(), crcs.ravel())
    read = reader.read_units(UnitReads(names, sizes, per, *columns, starts=not known))
    if not read:
        return 0
    if known:
        headed, digests = read, np.array(tables[:read], np.uint64).reshape(read, -1)
    else:
        ok, digests = header_rows(head_rows[:read], obj, tier.space, names[:read], tier.checks)
        headed = int(np.argmin(ok)) if not ok.all() else read
        for table, row in zip(tables[:headed], digests.tolist(), strict=False):
            table.extend(row)
    bad = np.flatnonzero((crcs[:headed, skip:] != digests[:headed][:, pages.rows]).any(axis=1))
    intact = int(bad[0]) if len(bad) else headed
    if intact < read:
        tier.trace.op("l3_corrupt")  # there at its size, and not what its header says
    return intact
