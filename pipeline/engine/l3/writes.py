"""A write-back's pages stored a batch at a time: where the store writes natively
(`ObjectStore.units_writer`), the host pool holds this rank's units as bytes and the check is
CRC-32C, every object in one store call, each page's header with its units' CRC-32C: summed
by the store as it writes each unit where it can (`UnitsWriter.sums_units`: one pass over the
pool), else all in one native call on the I/O threads first; elsewhere a page a task on the
I/O threads (`L3Tier.write`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.core.l3 import header, table_at
from pipeline.engine.l3.stores import Part
from pipeline.engine.l3.stores._fileio import crcs_of
from pipeline.engine.l3.tier import L3Tier


def write_pages(
    tier: L3Tier, keys: Sequence[str], pages: Sequence[int], shares: Sequence[Mapping]
) -> None:
    """Store each page's object: this rank's units from its host page, the rest from its
    share (rotating: the other owners' bytes, by unit ordinal). The first failure is raised
    once every page was tried."""
    own, writer = tier.roles.reads, tier.store.units_writer()
    pool = tier.page_map(own, device=False)
    if writer is None or not pool.direct or tier.runs_crc is None:
        list(tier.io.map(tier.write, keys, pages, shares))
        return
    units, objects = tier.object.units, list[list[Part]]()
    for page, received in zip(pages, shares, strict=True):
        views = dict(zip((u.ordinal for u in own), pool.views(page), strict=True))
        objects.append([(views | dict(received))[u.ordinal] for u in units])
    names, sizes = [tier.name(k) for k in keys], [u.page_bytes for u in units]
    if writer.sums_units:  # headers with blank digests: the store fills them
        blank = [0] * len(units)
        heads = [bytearray(header(tier.space, n, blank, sizes, tier.checks)) for n in names]
        summed = [(n, [h, *parts]) for n, h, parts in zip(names, heads, objects, strict=True)]
        writer.put_many(summed, [table_at(tier.space, n) for n in names])
        return
    crcs = crcs_of([part for parts in objects for part in parts], tier.storage.io_threads)
    stored: list[tuple[str, Sequence[Part]]] = []
    for i, (name, parts) in enumerate(zip(names, objects, strict=True)):
        digests = crcs[i * len(units) : (i + 1) * len(units)]
        stored.append((name, [header(tier.space, name, digests, sizes, tier.checks), *parts]))
    writer.put_many(stored)
