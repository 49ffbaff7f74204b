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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pipeline.config.compose import GROUP_CHOICE_PREFIXES, Session
from pipeline.config.job import Job
from pipeline.engine.engine import Engine
from pipeline.engine.stores import ObjectStore, open_store
from pipeline.jobs.bench.cases import check_fit, launch_cases
from pipeline.jobs.bench.l3_report import l3_markdown, summarize_l3
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.contents import fill_random, first_mismatch, poison_host, snapshot
from pipeline.jobs.l3_store import concrete
from pipeline.jobs.progress import progress
from pipeline.jobs.run import start_runtime
from pipeline.spec.l3 import largest_object
from pipeline.spec.model import ModelGeometry
from pipeline.spec.slots import page_tokens
from pipeline.spec.storage import StorageConfig

SEGMENT_SLACK = 1.5
"""Mooncake segments hold this many times one case's objects (headers, allocator slack)."""


def l3_cases(session: Session) -> list[tuple[Job, dict]]:
    """(job, case) per store, size and strategy; every strategy must be active."""
    base = session.job()
    kept = [o for o in session.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
    found = []
    for store in base.bench.stores:
        for tokens in base.bench.sizes:
            per_rank = tokens * base.model.bytes_per_token * SEGMENT_SLACK / base.topology.tp_size
            for strategy in base.bench.strategies:
                job = Session.compose(
                    [
                        *kept,
                        f"storage={store.value}",
                        f"strategy={strategy}",
                        f"workload.num_tokens={tokens}",
                        f"workload.device_tokens={2 * tokens}",
                        "workload.host_ratio=0.5",
                        "strategy.keep_capacity=true",
                        f"storage.segment_bytes={max(int(per_rank), 64 << 20)}",
                    ]
                ).job()
                if not job.verdict.active:
                    why = [r.message for r in job.verdict.rules if not r.passed]
                    raise ValueError(f"strategy {strategy} is inactive here: {why}")
                found.append((job, {"store": store.value, "tokens": tokens, "strategy": strategy}))
    return found


def run_l3_bench(session: Session) -> dict[str, Any]:
    """Every case on every rank, the stores made for the run; the summary, also written to
    `bench.out_dir`."""
    base, cases = session.job(), l3_cases(session)
    check_fit(cases)
    with contextlib.ExitStack() as stack:
        made = {kind: stack.enter_context(concrete(job.storage)) for kind, job in kinds(cases)}
        ranks = launch_cases(bench_l3_rank, base, with_stores(cases, made))
    if ranks is None:
        return {}
    result = summarize_l3(ranks, cases, base)
    out = Path(base.bench.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_l3.json").write_text(json.dumps({**result, "raw": ranks}, indent=2))
    (out / "bench_l3.md").write_text(l3_markdown(result))
    return result


def bench_l3_rank(
    payload: tuple[Job, list[tuple[Job, dict]]], rank: int, world_size: int, local_rank: int
) -> dict[str, Any]:
    """Entry point of one rank: every (job, case) in order on one runtime, each store opened
    once for all of its cases (a Mooncake client that left could still be handed new objects
    by the master for a while)."""
    base, cases = payload
    runtime = start_runtime(base, rank, world_size, local_rank)
    timer = Timer(runtime, base.bench)
    with contextlib.ExitStack() as stack:
        stack.callback(runtime.close)
        stores = {
            kind: stack.enter_context(_opened(storage, base.model))
            for kind, storage in _stores(cases)
        }
        result: dict[str, Any] = {"rank": rank, "cases": []}
        for job, case in progress(cases, "L3 bench cases", rank=rank):
            engine = Engine.create(
                job.strategy,
                runtime,
                job.model,
                job.topology,
                device_tokens=job.workload.device_tokens,
                host_ratio=job.workload.host_ratio,
                storage=job.storage,
                store=stores[case["store"]],
            )
            try:
                result["cases"].append(measure_l3_case(timer, engine, case))
            finally:
                assert engine.l3 is not None
                engine.l3.close()  # not the runtime, nor the store: they serve every case
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result


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
                    made[case["store"]], segment_bytes=job.storage.segment_bytes
                ),
            ),
            case,
        )
        for job, case in cases
    ]


def _stores(cases: list[tuple[Job, dict]]) -> list[tuple[str, StorageConfig]]:
    """Per store kind, its storage with the largest case's segment."""
    found: dict[str, StorageConfig] = {}
    for job, case in cases:
        held = found.get(case["store"])
        if held is None or held.segment_bytes < job.storage.segment_bytes:
            found[case["store"]] = job.storage
    return list(found.items())


@contextlib.contextmanager
def _opened(storage: StorageConfig, model: ModelGeometry) -> Iterator[ObjectStore]:
    store = open_store(storage, largest_object(model))
    try:
        yield store
    finally:
        store.close()


def measure_l3_case(timer: Timer, engine: Engine, case: dict) -> dict[str, Any]:
    """Back up, write back and evict one prefix; then time loading it back from L3."""
    size, n = engine.sizing.slots_per_page, case["tokens"] // engine.sizing.slots_per_page
    source, target = list(range(n)), list(range(n, 2 * n))
    fill_random(engine, source, case["tokens"] + engine.runtime.replica_group[0])
    expected = snapshot(engine, source)
    host = engine.host_allocator.alloc(n)
    engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
    keys = engine.l3_keys(range(case["tokens"]))
    timer.line_up()
    began = time.perf_counter()
    engine.write_back(keys, page_tokens(host, size)).wait()
    _drain(engine)
    write_back_s = time.perf_counter() - began
    poison_host(engine, host)
    engine.host_allocator.free(host)
    read_before = engine.trace.bytes.get(("l3_read", ""), 0)
    outcome: dict[str, Any] = {"hits": [], "fallbacks": 0, "load_s": [], "fetch_s": []}

    def load() -> None:
        fresh = engine.host_allocator.alloc(n)
        timer.line_up()
        began = time.perf_counter()
        engine.lookup(keys)
        loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens(target, size))
        outcome["fetch_s"].append(time.perf_counter() - began)  # lookup, reads, load issued
        if loaded.handle is not None:
            loaded.handle.done(engine.runtime.forward_stream).wait()
        outcome["load_s"].append(time.perf_counter() - began)
        outcome["hits"].append(loaded.hits)
        outcome["fallbacks"] += loaded.fallback
        _drain(engine)
        engine.host_allocator.free(fresh)

    runs = timer.bench.warmup + timer.bench.repeats
    for _ in range(runs):
        load()
    exact = not first_mismatch(engine, target, expected)
    timer.line_up()
    _remove_written(engine, keys)  # the next case starts from an empty store
    return {
        "write_back_s": write_back_s,
        "load_s": outcome["load_s"][timer.bench.warmup :],
        "fetch_s": outcome["fetch_s"][timer.bench.warmup :],
        "hits": min(outcome["hits"]),
        "fallbacks": outcome["fallbacks"],
        "l3_read_bytes_per_load": (engine.trace.bytes.get(("l3_read", ""), 0) - read_before)
        // runs,
        "bit_exact": exact and min(outcome["hits"]) == n,
    }


def _remove_written(engine: Engine, keys: list[str]) -> None:
    tier = engine.l3
    assert tier is not None, "an L3 case has a store"
    if tier.rank == tier.roles.writer:
        tier.store.remove([tier.name(k) for k in keys])


def _drain(engine: Engine) -> None:
    while engine.acks.pending:
        engine.poll()
