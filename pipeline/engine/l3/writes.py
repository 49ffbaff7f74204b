"""A write-back's pages stored a batch at a time: where the store writes natively
(`ObjectStore.units_writer`), the host pool holds this rank's units as bytes and the check is
CRC-32C, every object in one store call (`put_summed`); elsewhere a page a task on the I/O
threads (`L3Tier.write`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.core.l3 import header, table_at
from pipeline.engine.l3.page_reads import Objects
from pipeline.engine.l3.stores import Part, UnitsWriter
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
    objects = []
    for page, received in zip(pages, shares, strict=True):
        views = dict(zip((u.ordinal for u in own), pool.views(page), strict=True))
        objects.append([(views | dict(received))[u.ordinal] for u in tier.object.units])
    names = [tier.name(k) for k in keys]
    put_summed(writer, tier, names, objects, tier.storage.io_threads)


def put_summed(
    writer: UnitsWriter,
    objects: Objects,
    names: Sequence[str],
    units: Sequence[Sequence[Part]],
    threads: int,
) -> None:
    """Each object `names[i]`, its header then its `units[i]`, stored by `writer` in one call,
    the header holding each unit's CRC-32C: summed by the store as it writes each unit where
    it can (`UnitsWriter.sums_units`: one pass over the pool), else all in one native call
    on `threads` threads first. The first failure is raised once every object was tried."""
    space, checks = objects.space, objects.checks
    sizes = [[memoryview(u).nbytes for u in parts] for parts in units]
    if writer.sums_units:  # headers with blank digests: the store fills them
        heads = [
            bytearray(header(space, n, [0] * len(s), s, checks))
            for n, s in zip(names, sizes, strict=True)
        ]
        stored = [(n, [h, *p]) for n, h, p in zip(names, heads, units, strict=True)]
        writer.put_many(stored, [table_at(space, n) for n in names])
        return
    crcs = iter(crcs_of([part for parts in units for part in parts], threads))
    writer.put_many(
        [
            (n, [header(space, n, [next(crcs) for _ in p], s, checks), *p])
            for n, p, s in zip(names, units, sizes, strict=True)
        ]
    )
