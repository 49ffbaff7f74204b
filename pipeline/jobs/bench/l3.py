"""`bench bench=l3`: load-back from L3 for each strategy side by side, per store and size.

Per case every rank fills its device pages, backs them up, writes them back to L3 and evicts
them from the host tier; then each timed repetition (all ranks lined up first) is one
`lookup` + `load_from_l3` into device pages until the load's ack, checked bit-exact once.
replicated (every rank reads every object) is the reference each row is compared with. Each
store is made once for the whole run (`pipeline.jobs.l3_store.concrete`); a case removes its
objects at its end, so Mooncake's segments hold one case at a time. The file store's objects
are read back from the OS page cache (written just before, never dropped): a warm cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.config.compose import GROUP_CHOICE_PREFIXES, Session
from pipeline.config.drive_schemas import BenchConfig, PageCache
from pipeline.config.job import Job
from pipeline.core.checks import ConfigError
from pipeline.core.l3 import largest_object
from pipeline.core.model import ModelGeometry
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.factory import engine_on
from pipeline.engine.l3.stores import ObjectStore, open_store
from pipeline.jobs.bench.cases import check_fit, launch_cases
from pipeline.jobs.bench.l3_case import measure_l3_case
from pipeline.jobs.bench.l3_report import l3_markdown, summarize_l3
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.l3_store import check_direct_io, concrete
from pipeline.jobs.outputs import check_outputs, write_output
from pipeline.jobs.progress import progress

SEGMENT_SLACK = 2.5
"""Mooncake segments hold this many times one case's objects (headers, allocator slack, and
the raw loop's copy of them as one object a page, `limits.mooncake_limits`)."""


def store_case(base: Job, store: StorageKind, tokens: int, strategy: str) -> list[str]:
    """The overrides of one case that loads back `tokens` from `store` (the L3 and TTFT
    benches'): pools that hold the transfer twice, Mooncake segments that hold its objects."""
    per_rank = tokens * base.model.bytes_per_token * SEGMENT_SLACK / base.topology.tp_size
    # a storage.path given for the file cases is no other store's: theirs would refuse it
    folder = [] if store is StorageKind.file else ["storage.path=null"]
    return [
        *folder,
        f"storage={store.value}",
        f"strategy={strategy}",
        f"workload.num_tokens={tokens}",
        f"workload.device_tokens={2 * tokens}",
        "workload.host_ratio=0.5",
        "strategy.keep_capacity=true",
        f"storage.segment_bytes={max(int(per_rank), 64 << 20)}",
    ]


def l3_cases(session: Session) -> list[tuple[Job, dict]]:
    """(job, case) per store, size and strategy; every strategy must be active."""
    base = session.job()
    kept = [o for o in session.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
    found = []
    for store, cache, direct in store_caches(base.bench):
        for tokens in base.bench.sizes:
            for strategy in base.bench.strategies:
                direct_io = f"storage.direct_io={str(direct).lower()}"
                case_overrides = store_case(base, store, tokens, strategy)
                job = Session.compose([*kept, *case_overrides, direct_io]).job()
                if not job.verdict.active:
                    why = [r.message for r in job.verdict.rules if not r.passed]
                    raise ValueError(f"strategy {strategy} is inactive here: {why}")
                case = {"store": store.value, "cache": cache.value, "tokens": tokens}
                case["io"] = "direct" if direct else "buffered"
                found.append((job, {**case, "strategy": strategy}))
    return found


def store_caches(bench: BenchConfig) -> list[tuple[StorageKind, PageCache, bool]]:
    """Each store with each page-cache state it has (only a file store can be cold; a cold
    one is read both through the page cache and around it, with O_DIRECT)."""
    found = []
    for store in bench.stores:
        for cache in bench.caches if store is StorageKind.file else [PageCache.warm]:
            found.append((store, cache, False))
            if cache is PageCache.cold:
                found.append((store, cache, True))
    return found


def run_l3_bench(session: Session) -> dict[str, Any]:
    """Every case on every rank, the stores made for the run; the summary, also written to
    `bench.out_dir`."""
    base = session.job()
    check_outputs("bench.out_dir", Path(base.bench.out_dir), ["bench_l3.json", "bench_l3.md"])
    cases = l3_cases(session)  # composed after the instant checks: it takes seconds
    check_fit(cases)
    with contextlib.ExitStack() as stack:
        made = {kind: stack.enter_context(concrete(job.storage)) for kind, job in kinds(cases)}
        cases, notes = with_direct_io(cases, made)
        ranks = launch_cases(bench_l3_rank, base, with_stores(cases, made))
    if ranks is None:
        return {}
    result = {**summarize_l3(ranks, cases, base), "notes": notes}
    out = Path(base.bench.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_output(out / "bench_l3.json", json.dumps({**result, "raw": ranks}, indent=2))
    write_output(out / "bench_l3.md", l3_markdown(result))
    return result


def bench_l3_rank(
    payload: tuple[Job, list[tuple[Job, dict]]], rank: int, world_size: int, local_rank: int
) -> dict[str, Any]:
    """Entry point of one rank: every (job, case) in order on one runtime, each store opened
    once for all of its cases (a Mooncake client that left could still be handed new objects
    by the master for a while)."""
    base, cases = payload
    runtime = base.recipe().start_runtime(local_rank)
    timer = Timer(runtime, base.bench)
    with contextlib.ExitStack() as stack:
        stack.callback(runtime.close)
        stores = {
            kind: stack.enter_context(_opened(storage, base.model, runtime.timeout_s))
            for kind, storage in _stores(cases)
        }
        result: dict[str, Any] = {"rank": rank, "cases": []}
        for job, case in progress(cases, "L3 bench cases", rank=rank):
            engine = engine_on(job.recipe(), runtime, store=stores[store_key(case)])
            try:
                result["cases"].append(measure_l3_case(timer, engine, case, job.storage))
            finally:
                assert engine.l3 is not None
                engine.l3.close()  # not the runtime, nor the store: they serve every case
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result


def with_direct_io(
    cases: list[tuple[Job, dict]], made: dict[str, StorageConfig]
) -> tuple[list[tuple[Job, dict]], list[str]]:
    """The cases, less the O_DIRECT ones where the file store's folder refuses O_DIRECT
    (tmpfs), with a note saying so."""
    folder = made["file"].path if "file" in made else None
    if folder is None or not any(case["io"] == "direct" for _, case in cases):
        return cases, []
    try:
        check_direct_io(dataclasses.replace(made["file"], direct_io=True), folder)
    except ConfigError as e:
        return [c for c in cases if c[1]["io"] != "direct"], [f"no O_DIRECT cases: {e}"]
    return cases, []


def kinds(cases: list[tuple[Job, dict]]) -> list[tuple[str, Job]]:
    """Each store kind once, with its first case's job."""
    first: dict[str, Job] = {}
    for job, case in cases:
        first.setdefault(case["store"], job)
    return list(first.items())


def with_stores(
    cases: list[tuple[Job, dict]], made: dict[str, StorageConfig]
) -> list[tuple[Job, dict]]:
    """Each case on the store made for its kind (its folder or master), keeping the case's
    own segment size: a segment sized for a smaller case would make Mooncake evict."""
    return [
        (
            dataclasses.replace(
                job,
                storage=dataclasses.replace(
                    made[case["store"]],
                    segment_bytes=job.storage.segment_bytes,
                    direct_io=job.storage.direct_io,
                ),
            ),
            case,
        )
        for job, case in cases
    ]


def store_key(case: dict) -> str:
    """Which opened store a case uses: its kind, and how a file store reads."""
    return f"{case['store']}-{case['io']}"


def _stores(cases: list[tuple[Job, dict]]) -> list[tuple[str, StorageConfig]]:
    """Per store kind and read mode, its storage with the largest case's segment."""
    found: dict[str, StorageConfig] = {}
    for job, case in cases:
        held = found.get(store_key(case))
        if held is None or held.segment_bytes < job.storage.segment_bytes:
            found[store_key(case)] = job.storage
    return list(found.items())


@contextlib.contextmanager
def _opened(
    storage: StorageConfig, model: ModelGeometry, timeout_s: float
) -> Iterator[ObjectStore]:
    store = open_store(storage, largest_object(model), timeout_s=timeout_s)
    try:
        yield store
    finally:
        store.close()
