"""read_objects: read each page's objects from L3 until the first miss."""

from __future__ import annotations

from pipeline.engine.l3 import L3Tier, ObjectsJob
from pipeline.spec.l3 import unpack


class ReadObjects:
    """Per page in order, the objects this rank reads, into its host pages (or, after a
    fallback, every object into its device pages). A missing, truncated, corrupted or foreign
    object is a miss: that page and every later one are not loaded (`job.hits` stops there)."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        reads = tier.reads(job.fallback)
        into = job.device_pages if job.fallback else job.host_pages
        assert into is not None, "a fetch names its device pages"
        for i, (key, page) in enumerate(zip(job.keys[: job.hits], into, strict=False)):
            for spec in reads:
                name = spec.name(tier.space, key)
                body = unpack(tier.store.get(name), tier.space, name, spec.page_bytes)
                if body is None:
                    tier.trace.op("l3_miss")
                    job.hits = i
                    return
                tier.place(spec, body, int(page), device=job.fallback)
                tier.trace.op("l3_read", bytes=spec.page_bytes)
