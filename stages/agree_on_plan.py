"""agree_on_plan: before a deduplicated L3 load, check that every rank plans the same load."""

from __future__ import annotations

import logging

from pipeline.engine.l3.tier import L3Tier, ObjectsJob

log = logging.getLogger("hicache-pipeline")


class AgreeOnPlan:
    """All-gather a SHA-256 of each rank's logical plan (keys, pages, order) in the replica
    group. If any differ, a reader's broadcast would deliver someone else's pages, so this
    fetch falls back to per-rank reads (every rank reads every object it needs itself), and
    says so in the log and the trace."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        digests = tier.agree(job.plan_digest())
        if len(set(digests)) > 1:
            job.fallback = True
            tier.trace.op("l3_fallback")
            log.warning(
                "rank %d: the replica group %s planned different L3 loads (%d distinct plans); "
                "this load falls back to per-rank reads",
                tier.rank,
                list(tier.group),
                len(set(digests)),
            )
