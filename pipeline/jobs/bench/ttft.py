"""`bench bench=ttft`: what a prefix hit is worth to the time to first token, against
recomputing the prefix.

Per strategy that runs, store (none: a host-tier hit; file, mooncake: an L3 hit), prefix size
(`bench.sizes`) and new-token count (`bench.new_tokens`), every rank times a synthetic forward
of the model's published geometry (`forward.py`) alone, the hit's load alone, the load then
the forward, the forward consuming the layers as they arrive (`wait(layer)` on the forward
stream before each layer's work, as a serving engine does), and the same forward over the
prefix and the new tokens with nothing loaded. Output: bench_ttft.json, .md and .png in
`bench.out_dir`; "ok" when every row is bit-exact, its digests whole and its waits per layer.
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
from pipeline.config.job import Job
from pipeline.core.l3 import largest_object
from pipeline.core.model import ModelGeometry
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.engine import Engine
from pipeline.engine.factory import engine_on
from pipeline.engine.l3.stores import ObjectStore, open_store
from pipeline.engine.runtime import Runtime
from pipeline.jobs.bench.cases import check_fit, launch_cases
from pipeline.jobs.bench.forward import published_config
from pipeline.jobs.bench.l3 import kinds, store_case
from pipeline.jobs.bench.rank import Timer
from pipeline.jobs.bench.ttft_case import Recomputed, measure_ttft_case
from pipeline.jobs.bench.ttft_report import summarize_ttft, ttft_markdown, ttft_plot
from pipeline.jobs.l3_store import concrete
from pipeline.jobs.outputs import check_outputs, write_output
from pipeline.jobs.progress import progress

OUTPUTS = ["bench_ttft.json", "bench_ttft.md", "bench_ttft.png"]


def ttft_cases(session: Session) -> tuple[list[tuple[Job, dict]], list[dict]]:
    """(job, case) per store, size and strategy that is active there; the inactive ones with
    the reasons ("not measured")."""
    base = session.job()
    kept = [o for o in session.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
    runnable, skipped = [], []
    for store in base.bench.stores or [StorageKind.none]:
        for tokens in base.bench.sizes:
            for strategy in base.bench.strategies:
                job = Session.compose([*kept, *store_case(base, store, tokens, strategy)]).job()
                case = {"store": store.value, "tokens": tokens, "strategy": strategy}
                if job.verdict.active:
                    runnable.append((job, case))
                else:
                    why = [r.message for r in job.verdict.rules if not r.passed]
                    skipped.append({**case, "inactive": why})
    return runnable, skipped


def run_ttft_bench(session: Session) -> dict[str, Any]:
    """Every case on every rank, the stores made for the run; the summary, also written to
    `bench.out_dir` ({} on a torchrun rank other than 0)."""
    base = session.job()
    published_config(base.model)  # refuse a model of unknown compute before anything runs
    out = Path(base.bench.out_dir)
    check_outputs("bench.out_dir", out, OUTPUTS)
    cases, skipped = ttft_cases(session)  # composed after the instant checks: seconds
    check_fit(cases)
    with contextlib.ExitStack() as stack:
        l3 = [(kind, job) for kind, job in kinds(cases) if kind != StorageKind.none.value]
        made = {kind: stack.enter_context(concrete(job.storage)) for kind, job in l3}
        ranks = launch_cases(bench_ttft_rank, base, _on_made_stores(cases, made))
    if ranks is None:
        return {}
    result = summarize_ttft(ranks, cases, base) | {"skipped": skipped}
    out.mkdir(parents=True, exist_ok=True)
    write_output(out / OUTPUTS[0], json.dumps({**result, "raw": ranks}, indent=2))
    write_output(out / OUTPUTS[1], ttft_markdown(result))
    result["png"] = ttft_plot(result, out / OUTPUTS[2])
    return result


def ttft_text(result: dict[str, Any]) -> str:
    return ttft_markdown(result) + f"PNG: {result['png']}"


def bench_ttft_rank(
    payload: tuple[Job, list[tuple[Job, dict]]], rank: int, world_size: int, local_rank: int
) -> dict[str, Any]:
    """Entry point of one rank: every (job, case) in order on one runtime, each L3 store
    opened once for all of its cases (as the L3 bench does)."""
    base, cases = payload
    config = published_config(base.model)
    runtime = base.recipe().start_runtime(local_rank)
    timer = Timer(runtime, base.bench)
    recomputed: Recomputed = {}
    with contextlib.ExitStack() as stack:
        stack.callback(runtime.close)
        stores = {
            kind: stack.enter_context(_opened(storage, base.model, runtime.timeout_s))
            for kind, storage in _largest_segments(cases)
        }
        result: dict[str, Any] = {"rank": rank, "cases": []}
        for job, case in progress(cases, "ttft bench cases", rank=rank):
            engine = case_engine(job, runtime, stores.get(case["store"]))
            try:
                measured = measure_ttft_case(
                    timer, engine, config, case, job.bench.new_tokens, recomputed
                )
                result["cases"].append(measured)
            finally:
                _put_away(engine)
            if timer.cuda:
                torch.cuda.empty_cache()
        if timer.cuda:
            result["device_name"] = torch.cuda.get_device_name(runtime.device)
        return result


def case_engine(job: Job, runtime: Runtime, store: ObjectStore | None) -> Engine:
    """The one place this bench makes an engine: the case's pools on the shared runtime."""
    return engine_on(job.recipe(), runtime, store=store)


def _put_away(engine: Engine) -> None:
    """Drop a case's graphs and L3 tier, not the runtime nor the store: they serve every case."""
    if engine.graphs is not None:
        engine.graphs.clear()
    if engine.l3 is not None:
        engine.l3.close()


def _on_made_stores(
    cases: list[tuple[Job, dict]], made: dict[str, StorageConfig]
) -> list[tuple[Job, dict]]:
    """Each L3 case on the store made for its kind, keeping its own segment size."""
    placed = []
    for job, case in cases:
        if case["store"] in made:
            storage = dataclasses.replace(
                made[case["store"]], segment_bytes=job.storage.segment_bytes
            )
            job = dataclasses.replace(job, storage=storage)
        placed.append((job, case))
    return placed


def _largest_segments(cases: list[tuple[Job, dict]]) -> list[tuple[str, StorageConfig]]:
    """Per L3 store kind, its storage with the largest case's segment."""
    found: dict[str, StorageConfig] = {}
    for job, case in cases:
        held = found.get(case["store"])
        if case["store"] != StorageKind.none.value and (
            held is None or held.segment_bytes < job.storage.segment_bytes
        ):
            found[case["store"]] = job.storage
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
