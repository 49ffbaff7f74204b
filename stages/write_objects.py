"""write_objects: store this rank's share of each page in L3 (on the write-back thread)."""

from __future__ import annotations

from pipeline.engine.l3 import L3Tier, ObjectsJob
from pipeline.spec.l3 import pack


class WriteObjects:
    """Per page, the objects this rank writes (one writer per object and replica group), each
    packed with its header; objects already stored are left alone (a key names its bytes)."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        writes = tier.writes()
        wanted = [
            (spec, int(page), spec.name(tier.space, key))
            for key, page in zip(job.keys, job.host_pages, strict=True)
            for spec in writes
        ]
        stored = tier.store.exists([name for _, _, name in wanted]) if wanted else []
        for (spec, page, name), present in zip(wanted, stored, strict=True):
            if present:
                continue
            payload = tier.payload(spec, page)
            tier.store.put(name, pack(tier.space, name, payload))
            tier.trace.op("l3_write", bytes=len(payload))
