"""agree_on_hits: every rank of the replica group loads the same number of pages."""

from __future__ import annotations

from pipeline.engine.l3 import L3Tier, ObjectsJob


class AgreeOnHits:
    """The MIN over the replica group of the leading pages each rank read intact: a page one
    reader missed is loaded by nobody, so the broadcasts that follow match on every rank."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        job.hits = min(tier.agree(job.hits))
