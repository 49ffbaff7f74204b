"""write_objects: store each page's object in L3 (on the write-back thread)."""

from __future__ import annotations

from pipeline.engine.l3.intact import intact_pages
from pipeline.engine.l3.shares import hear_missing, receive_shares, send_share, tell_missing
from pipeline.engine.l3.tier import L3Tier, ObjectsJob
from pipeline.engine.l3.writes import write_pages


class WriteObjects:
    """Per page, its one object, written by the replica group's first rank (`write_pages`:
    in one native call where the store allows, else `storage.io_threads` at once), every page
    at once unless other owners send it units; an object already stored intact is left alone
    (a key names its bytes), anything else at its name (damaged, unkeyed under a key, not a
    regular file) is written over (`intact_pages`: each present object read and checked as a
    load checks it). Under rotating the other owners first send the writer their layers of
    the pages it will write, `batch_pages` at a time, and it writes those as they come. The
    first failed write fails the write-back."""

    def on_objects(self, job: ObjectsJob, tier: L3Tier) -> None:
        roles, pages = tier.roles, [int(p) for p in job.host_pages]
        if tier.rank == roles.writer:
            stored = intact_pages(tier, job.keys)
            missing = [i for i, present in enumerate(stored) if not present]
            tell_missing(tier, [not present for present in stored])
            step = tier.batch_pages if roles.senders else max(len(missing), 1)
            for first in range(0, len(missing), step):
                batch = missing[first : first + step]
                shares = receive_shares(tier, len(batch))
                write_pages(tier, [job.keys[i] for i in batch], [pages[i] for i in batch], shares)
                for _ in batch:
                    tier.trace.op("l3_write", bytes=tier.object.page_bytes)
        elif tier.rank in roles.senders:
            wanted = hear_missing(tier, len(pages))
            missing = [p for p, want in zip(pages, wanted, strict=True) if want]
            for first in range(0, len(missing), tier.batch_pages):
                send_share(tier, missing[first : first + tier.batch_pages])
