"""write_objects: store this rank's share of each page in L3 (on the write-back thread)."""

from __future__ import annotations

from pipeline.engine.l3 import L3Tier, ObjectsJob


class WriteObjects:
    """Per page, the objects this rank writes (one writer per object and replica group),
    several at once (`storage.io_threads`); objects already stored are left alone (a key
    names its bytes). The first failed write fails the write-back."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        writes = tier.writes()
        wanted = [
            (spec, key, int(page))
            for key, page in zip(job.keys, job.host_pages, strict=True)
            for spec in writes
        ]
        names = [spec.name(tier.space, key) for spec, key, _ in wanted]
        stored = tier.store.exists(names) if wanted else []
        missing = [w for w, present in zip(wanted, stored, strict=True) if not present]
        list(tier.io.map(lambda w: tier.write(w[0], w[1], w[2]), missing))
        for spec, _, _ in missing:
            tier.trace.op("l3_write", bytes=spec.page_bytes)
