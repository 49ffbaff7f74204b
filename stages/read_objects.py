"""read_objects: read each page's objects from L3; the leading intact pages are hits."""

from __future__ import annotations

from pipeline.engine.l3 import L3Tier, ObjectsJob


class ReadObjects:
    """The objects this rank reads, straight into its host pages (or, after a fallback, every
    object into its device pages), several at once (`storage.io_threads`). A missing,
    truncated, corrupted or foreign object is a miss: that page and every later one are not
    loaded (`job.hits` stops there), whatever the later reads found."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        reads = tier.reads(job.fallback)
        into = job.device_pages if job.fallback else job.host_pages
        assert into is not None, "a fetch names its device pages"

        def read_page(i: int) -> bool:
            key, page = job.keys[i], int(into[i])
            return all(tier.read(spec, key, page, device=job.fallback) for spec in reads)

        found = list(tier.io.map(read_page, range(job.hits)))
        intact = found.index(False) if False in found else len(found)
        for _ in range(intact):
            for spec in reads:
                tier.trace.op("l3_read", bytes=spec.page_bytes)
        if intact < job.hits:
            tier.trace.op("l3_miss")
            job.hits = intact
