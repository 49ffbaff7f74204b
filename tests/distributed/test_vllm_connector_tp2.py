"""`PipelineConnector` at TP2 under every strategy: vLLM 0.32.0's real `Scheduler` in the
test's process, each TP rank's worker connector on a gloo rank process of its own (as vLLM's
executor runs them), the step's metadata pickled to each. A prefix computed once is a hit for
the next request, from the host tier and then, with fresh connectors, from the file store;
on every rank every loaded row is checked as each layer's wait returned it."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

vllmfns = pytest.importorskip("vllmfns")
vllmsteps = pytest.importorskip("vllmsteps")
vllmranks = pytest.importorskip("vllmranks")

from pipeline.jobs.launch import launch  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("vllm_cache")]

A = list(range(100, 164))
B = A[:48] + list(range(500, 510))


def scheduled(scheduler, step, request) -> tuple:
    run = vllmsteps.run_to_completion(scheduler, step, 2, [request])
    stats = run.prefill[request.request_id]
    counts = (stats.num_local_cached_tokens, stats.num_external_cached_tokens)
    return counts, run.block_ids[request.request_id]


def tell(inboxes: list, command: str | None) -> None:
    for inbox in inboxes:
        inbox.put(command)


@pytest.mark.parametrize("strategy", ["replicated", "single_source", "rotating"])
def test_every_strategy_loads_a_prefix_at_tp2(strategy: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    model_dir = vllmfns.tiny_model_dir(tmp_path)
    extra = {"overrides": [f"strategy={strategy}", "storage=file", f"storage.path={store}"]}
    spec = (model_dir, extra, 2)
    ranks: dict[str, list] = {}
    with multiprocessing.get_context("spawn").Manager() as manager:
        inboxes, outbox = [manager.Queue() for _ in range(2)], manager.Queue()

        def run_ranks() -> None:
            args = (spec, inboxes, outbox)
            ranks["phases"] = launch(vllmranks.stepped, args, 2, backend="gloo", timeout_s=600)

        thread = threading.Thread(target=run_ranks)
        thread.start()
        config = vllmranks.config_of(spec)
        step = vllmranks.on_ranks(inboxes, outbox, thread.is_alive)
        scheduler, _ = vllmfns.make_scheduler(config)
        try:
            said = [scheduled(scheduler, step, vllmfns.make_request("A", A))]
            assert scheduler.reset_prefix_cache()  # vLLM's cache forgets A: the host tier has it
            tell(inboxes, "forget")
            said.append(scheduled(scheduler, step, vllmfns.make_request("B", B)))
            scheduler.connector.shutdown()
            scheduler, _ = vllmfns.make_scheduler(config)  # fresh connectors: host tier empty
            tell(inboxes, "fresh")
            said.append(scheduled(scheduler, step, vllmfns.make_request("B again", B)))
        finally:
            tell(inboxes, None)
            thread.join()
            scheduler.connector.shutdown()
    assert [counts for counts, _ in said[1:]] == [(0, 48), (0, 48)]  # host tier, then store
    for phases in ranks["phases"]:  # every rank's KV as each layer's first wait returned it
        for phase in (1, 2):
            vllmfns.check_rows(vllmranks.as_kv(phases[phase]), said[phase][1], B[:48])
