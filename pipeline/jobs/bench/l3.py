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
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.config.compose import GROUP_CHOICE_PREFIXES, Session
from pipeline.config.job import Job
from pipeline.engine.engine import Engine
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.contents import fill_random, first_mismatch, poison_host, snapshot
from pipeline.jobs.l3_store import concrete
from pipeline.jobs.launch import launch
from pipeline.jobs.resources import resource_problems
from pipeline.jobs.run import backend_of, start_runtime
from pipeline.spec.checks import raise_problems
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
    for job, _ in cases:  # the machine must hold each case's pools (one case at a time)
        workload = job.workload
        raise_problems(
            resource_problems(
                job, device_tokens=workload.device_tokens, host_ratio=workload.host_ratio
            )
        )
    with contextlib.ExitStack() as stack:
        stores: dict[str, StorageConfig] = {}
        for job, case in cases:
            if case["store"] not in stores:
                stores[case["store"]] = stack.enter_context(concrete(job.storage))
        concrete_cases = [
            (dataclasses.replace(job, storage=stores[case["store"]]), case) for job, case in cases
        ]
        timeout_s = base.runtime.timeout_s
        ranks = launch(
            bench_l3_rank,
            (base, concrete_cases),
            base.topology.tp_size,
            backend=backend_of(base),
            timeout_s=timeout_s,
            job_s=timeout_s * (len(cases) + 1),
        )
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
    """Entry point of one rank: every (job, case) in order on one runtime."""
    base, cases = payload
    runtime = start_runtime(base, rank, world_size, local_rank)
    timer = Timer(runtime, base.bench)
    try:
        result: dict[str, Any] = {"rank": rank, "cases": []}
        for job, case in cases:
            engine = Engine.create(
                job.strategy,
                runtime,
                job.model,
                job.topology,
                device_tokens=job.workload.device_tokens,
                host_ratio=job.workload.host_ratio,
                storage=job.storage,
            )
            try:
                result["cases"].append(measure_l3_case(timer, engine, case))
            finally:
                assert engine.l3 is not None
                engine.l3.close()  # not the runtime: it serves every case
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result
    finally:
        runtime.close()


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
    outcome: dict[str, Any] = {"hits": [], "fallbacks": 0, "load_s": []}

    def load() -> None:
        fresh = engine.host_allocator.alloc(n)
        timer.line_up()
        began = time.perf_counter()
        engine.lookup(keys)
        loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens(target, size))
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
        "hits": min(outcome["hits"]),
        "fallbacks": outcome["fallbacks"],
        "l3_read_bytes_per_load": (engine.trace.bytes.get(("l3_read", ""), 0) - read_before)
        // runs,
        "bit_exact": exact and min(outcome["hits"]) == n,
    }


def _remove_written(engine: Engine, keys: list[str]) -> None:
    tier = engine.l3
    assert tier is not None, "an L3 case has a store"
    tier.store.remove([o.name(tier.space, k) for k in keys for o in tier.writes()])


def _drain(engine: Engine) -> None:
    while engine.acks.pending:
        engine.poll()


def summarize_l3(ranks: list[dict], cases: list[tuple[Job, dict]], base: Job) -> dict[str, Any]:
    """One row per case: the slowest rank's median load, and its ratio to replicated's."""
    rows = []
    for i, (job, case) in enumerate(cases):
        per_rank = [r["cases"][i] for r in ranks]
        unique = case["tokens"] * job.model.bytes_per_token
        seconds = max(statistics.median(c["load_s"]) for c in per_rank)
        rows.append(
            {
                **case,
                "ms": seconds * 1e3,
                "write_back_ms": max(c["write_back_s"] for c in per_rank) * 1e3,
                "gbps": unique / seconds / 1e9,
                "l3_read_bytes_per_rank": [c["l3_read_bytes_per_load"] for c in per_rank],
                "fallbacks": sum(c["fallbacks"] for c in per_rank),
                "bit_exact": all(c["bit_exact"] for c in per_rank),
                "unique_bytes": unique,
            }
        )
    for row in rows:
        reference = next(
            r
            for r in rows
            if (r["store"], r["tokens"], r["strategy"])
            == (row["store"], row["tokens"], "replicated")
        )
        row["x_replicated"] = reference["ms"] / row["ms"]
    return {
        "model": base.model.name,
        "topology": base.topology.name,
        "ranks": len(ranks),
        "device_name": ranks[0].get("device_name", "cpu"),
        "page_cache": "warm: file objects are read back right after they were written",
        "rows": rows,
    }


def l3_markdown(result: dict[str, Any]) -> str:
    """bench_l3.md: one row per store, size and strategy."""
    lines = [
        f"{result['model']} on {result['topology']}: {result['ranks']} x {result['device_name']}"
        f" (file store: OS page cache {result['page_cache']})",
        "",
        "| store | tokens | strategy | load ms | GB/s | x replicated | L3 read per rank "
        "| write-back ms | bit-exact |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in result["rows"]:
        reads = " / ".join(f"{b / 1e6:.1f} MB" for b in r["l3_read_bytes_per_rank"])
        lines.append(
            f"| {r['store']} | {r['tokens']} | {r['strategy']} | {r['ms']:.1f} "
            f"| {r['gbps']:.2f} | {r['x_replicated']:.3f} | {reads} "
            f"| {r['write_back_ms']:.1f} | {'yes' if r['bit_exact'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
