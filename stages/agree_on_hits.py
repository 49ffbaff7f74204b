"""agree_on_hits: every rank of the replica group loads the same pages, window by window."""

from __future__ import annotations

from pipeline.engine.l3.fetch import drain, settle
from pipeline.engine.l3.tier import L3Tier, ObjectsJob


class AgreeOnHits:
    """Per window of `storage.load_chunk_pages` pages, once this rank's reads of it are done:
    the MIN over the replica group of the leading pages each rank read intact, handed to the
    load at once (its broadcasts then match on every rank), so the load of one window runs
    while the next is read. A page one reader missed is loaded by nobody, and neither is any
    page after it. Every rank takes part in as many rounds as the longest fetch needs (the
    agreement is a collective of all ranks, and DP-attention groups may stop at different
    windows)."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        total, step = job.hits, job.window_pages or max(job.hits, 1)
        agreed, going, agreed_all = 0, True, False
        try:
            while True:
                stop = min(agreed + step, total)
                mine = settle(tier, job, agreed, stop) if going else agreed
                # whether this rank may read on after this round: no round is held only to
                # learn that every rank is done
                found, anyone = tier.agree_while(mine, going and stop < total)
                if going:
                    intact = min(found)
                    if intact > agreed and job.release is not None and not job.fallback:
                        job.release(agreed, intact)
                    agreed, going = intact, intact == stop < total
                if not anyone:
                    break
            agreed_all = agreed == total
        finally:
            drain(job, keep_later=agreed_all)
        job.hits = agreed
