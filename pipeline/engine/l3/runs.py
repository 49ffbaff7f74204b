"""A streamed load's later groups of layers: read in runs of pages, one store call a run.

Each later group reads only its layers' bytes of every page, checked against the digest table
that the page's first group read from its header (`ObjectsJob.tables`), so no header is read
again. Where the store reads natively (`pipeline.engine.l3.batch`), one task reads every page's
later groups in one call on threads of its own. Elsewhere the pages are split into a run per
I/O thread; one task per run reads its pages group after group, each group in one
`PartsReader` call, through one reader that may hold each object
open from its first read to its last: a task, a store call and an open per page and group would
turn Python's lock several times a page, and with many threads each waiting for it in turn,
more threads read a group slower than one. Where a group's units are one run in the object and
in the pool, the call is `read_spans`: a `preadv` and a CRC call per page, nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future

from pipeline.engine.l3.batch import batched, lands_in_pool
from pipeline.engine.l3.group_reads import read_groups
from pipeline.engine.l3.jobs import ObjectsJob, Run
from pipeline.engine.l3.pages import PageMap, page_ranges, span_checks, unit_checks
from pipeline.engine.l3.stores import PartRead, PartsReader, SpanReads
from pipeline.engine.l3.tier import L3Tier


def start_runs(tier: L3Tier, jobs: list[ObjectsJob]) -> tuple[list[list[Run]], list[Future[None]]]:
    """Start reading the later groups `jobs` (the same pages each, in group order): a task
    per run of pages, one per I/O thread (one in all where the store reads natively, on
    threads of its own), reads its pages group after group through one
    `PartsReader` (which may keep each object open from its first read to the last) and
    resolves each group's future of its run as it goes; a cancelled future stops its task.
    Also the tasks themselves (a native call's last ranges land after their futures)."""
    count = len(jobs[0].keys) if jobs else 0
    native = bool(jobs) and batched(tier, jobs[0].units, device=False)  # threads of its own
    per_run = max(1, count if native else -(-count // tier.storage.io_threads))
    bounds = [(f, min(f + per_run, count)) for f in range(0, count, per_run)]
    runs: list[list[Run]] = [[(f, s, Future()) for f, s in bounds] for _ in jobs]
    tasks = [
        tier.io.submit(_read_groups, tier, jobs, [group[c][2] for group in runs], first, stop)
        for c, (first, stop) in enumerate(bounds)
    ]
    return runs, tasks


def _read_groups(
    tier: L3Tier, jobs: list[ObjectsJob], futures: list[Future[int]], first: int, stop: int
) -> None:
    """One run's pages, group after group, until a group misses one or is cancelled; the
    groups after that one resolve as having read nothing."""
    native = tier.store.units_reader() if batched(tier, jobs[0].units, device=False) else None
    if native is not None:
        try:
            read_groups(tier, native, jobs, futures, first, stop)
        finally:
            native.close()
        return
    reader = tier.store.parts_reader()
    try:
        groups = iter(zip(jobs, futures, strict=True))
        for job, future in groups:
            if not future.set_running_or_notify_cancel():
                break  # the load failed: it cancels every group after the one that missed
            try:
                found = read_run(tier, reader, job, first, stop)
            except BaseException as e:
                future.set_exception(e)
                break
            future.set_result(found)
            if found < stop - first:
                break
        for _, later in groups:  # the groups after a miss, a failure or a cancel
            if later.set_running_or_notify_cancel():
                later.set_result(0)
    finally:
        reader.close()


def read_run(tier: L3Tier, reader: PartsReader, job: ObjectsJob, first: int, stop: int) -> int:
    """Pages [first, stop) of the job, in one `reader` call where the pool takes the reads
    straight into its rows (else a page at a time, staged); how many were read intact."""
    pages = tier.page_map(job.units, device=False)
    keys, into, tables = job.keys[first:stop], job.host_pages[first:stop], job.tables[first:stop]
    if not pages.direct:
        read = (
            tier.read(key, int(page), job.units, device=False, table=table)
            for key, page, table in zip(keys, into, tables, strict=True)
        )
        return next((i for i, ok in enumerate(read) if not ok), len(keys))
    spans = span_reads(tier, pages, keys, into, tables)
    if spans is not None:
        found = reader.read_spans(spans)
        name = spans.names[found] if found < len(keys) else ""
    else:
        reads = [
            part_read(tier, pages, key, int(page), table)
            for key, page, table in zip(keys, into, tables, strict=True)
        ]
        found = reader.read_parts(reads)
        name = reads[found][0] if found < len(keys) else ""
    if name and tier.store.exists([name]) == [True]:
        tier.trace.op("l3_corrupt")  # there, and not what its first group's header said
    return found


def span_reads(
    tier: L3Tier, pages: PageMap, keys: list[str], into: Iterable[int], tables: list[list[int]]
) -> SpanReads | None:
    """The reads of `pages`' units of these pages as one range each, straight into one run
    of pool memory, each checked by one CRC that its units' CRCs combine to; None where the
    units are not one run in the object and in the pool, or the check is keyed."""
    runs_crc, groups = tier.runs_crc, [g for g, (_, at) in enumerate(pages.groups) if at]
    if runs_crc is None or len(groups) != 1 or pages.spans(0) is None:
        return None
    g, obj = groups[0], tier.object
    at, rows, sizes = (
        pages.groups[g][0],
        [pages.rows[j] for j in pages.groups[g][1]],
        pages.sizes[g],
    )
    names = [tier.name(key) for key in keys]
    heads = [obj.header_size(tier.space, name, tier.checks) for name in names]
    views = [pages.spans(int(page))[g] for page in into]  # type: ignore[index]
    if len(rows) == 1:
        crcs = [table[rows[0]] for table in tables]
    else:
        crcs = [runs_crc([table[r] for r in rows], sizes) for table in tables]
    return SpanReads(
        names, [h + obj.page_bytes for h in heads], [h + at for h in heads], views, crcs
    )


def part_read(tier: L3Tier, pages: PageMap, key: str, page: int, table: list[int]) -> PartRead:
    """The read of `pages`' units of one page's object, straight into the pool, checked
    against its known digest `table`."""
    name = tier.name(key)
    head = tier.object.header_size(tier.space, name, tier.checks)
    spans = pages.spans(page) if tier.runs_crc is not None else None
    if spans is not None and tier.runs_crc is not None:
        buffers, group_ok = span_checks(pages, spans, tier.runs_crc)
    else:
        buffers, group_ok = unit_checks(pages, pages.views(page), tier.digest)
    ranges = page_ranges(head, pages, buffers)
    return name, head + tier.object.page_bytes, ranges, lambda i: group_ok(i, table)


def settle_runs(tier: L3Tier, job: ObjectsJob, runs: list[Run]) -> int:
    """Wait for the runs' reads; the end of the job's leading intact pages."""
    nbytes = sum(u.page_bytes for u in job.units)
    into = "pool" if lands_in_pool(tier, job.units, device=False) else "staging"
    for first, stop, run in runs:
        found = first + run.result()
        tier.trace.repeat("l3_read", found - first, bytes=nbytes, into=into)
        if found < stop:
            tier.trace.op("l3_miss")
            return found
    return len(job.keys)
