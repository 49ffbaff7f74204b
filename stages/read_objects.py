"""read_objects: start reading each page's object from L3, ahead of the load."""

from __future__ import annotations

from pipeline.engine.l3.fetch import start_reads
from pipeline.engine.l3.tier import L3Tier, ObjectsJob


class ReadObjects:
    """Start the reads of this rank's units of every page, in page order, on the I/O threads
    (`storage.io_threads`): straight into its host pages (or, after a fallback, every unit into
    its device pages). Returns at once; `AgreeOnHits` waits for them window by window, so the
    load of one window runs while the next is read. A missing, truncated, corrupted or foreign
    object is a miss: that page and every later one are not loaded."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        start_reads(tier, job)
