"""A write-back's pages stored a batch at a time: where the store writes natively
(`ObjectStore.units_writer`), the host pool holds this rank's units as bytes and the check is
CRC-32C, every object in one store call (`put_summed`); elsewhere a page a task on the I/O
threads (`L3Tier.write`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pipeline.core.l3 import table_at
from pipeline.core.l3_rows import headers_of
from pipeline.engine.l3.page_reads import Objects
from pipeline.engine.l3.pages import PageMap
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
    units, names = tier.object.units, [tier.name(k) for k in keys]
    whole = [u.ordinal for u in own] == [u.ordinal for u in units]  # every unit, in order
    objects = page_parts(pool, pages, cut=whole and writer.sums_units)
    if not whole:  # rotating: the other owners' units from the share
        for i, (views, received) in enumerate(zip(objects, shares, strict=True)):
            held = dict(zip((u.ordinal for u in own), views, strict=True)) | dict(received)
            objects[i] = [held[u.ordinal] for u in units]
    put_summed(writer, tier, names, objects, tier.storage.io_threads)


def page_parts(pool: PageMap, pages: Sequence[int], *, cut: bool) -> list[Sequence[Part]]:
    """Each page's parts in the pool: with `cut` (a writer that sums units, so cuts its parts
    into them) and its units end to end as in its object, a buffer a run of them, not a
    Python object a unit; else a view a unit."""
    spans = [pool.spans(page) if cut else None for page in pages]
    return [pool.views(p) if s is None else s for p, s in zip(pages, spans, strict=True)]


def put_summed(
    writer: UnitsWriter,
    objects: Objects,
    names: Sequence[str],
    units: Sequence[Sequence[Part]],
    threads: int,
) -> None:
    """Each object `names[i]`, its header then its `units[i]` (a part per unit of
    `objects.object`; for a writer that sums units, runs of whole units end to end), stored
    by `writer` in one call, the header holding each unit's CRC-32C: summed by the store as
    it writes each unit where it can (`UnitsWriter.sums_units`: one pass over the pool), else
    all in one native call on `threads` threads first. The headers are made in bulk
    (`headers_of`: a header a page in Python took longer than the store took to write a
    page). The first failure is raised once every object was tried."""
    space, checks = objects.space, objects.checks
    unit_bytes = [u.page_bytes for u in objects.object.units]
    shape = (len(names), len(unit_bytes))
    if writer.sums_units:  # headers with blank digests: the store fills them
        heads = headers_of(space, names, np.zeros(shape, np.uint32), unit_bytes, checks)
        stored = [(n, [h, *p]) for n, h, p in zip(names, heads, units, strict=True)]
        writer.put_many(stored, [table_at(space, n) for n in names], unit_bytes)
        return
    crcs = crcs_of([part for parts in units for part in parts], threads)
    sums = np.asarray(crcs, np.uint32).reshape(shape)
    heads = headers_of(space, names, sums, unit_bytes, checks)
    writer.put_many([(n, [h, *p]) for n, h, p in zip(names, heads, units, strict=True)])
