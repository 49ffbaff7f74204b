"""Stepping vLLM 0.32.0's real `Scheduler` and its worker connectors as its model runner does
(`run_to_completion`), the stand-in model writing `vllmfns.expected_row` as each layer's KV:
in this process (`in_process`) or on rank processes (tests/vllmranks.py)."""

from collections.abc import Callable
from copy import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from vllm.forward_context import ForwardContext, override_forward_context
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.stats import PrefillStats
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllmfns import MLA_ROW, VLLM_0_26, OnLayer, expected_row


@dataclass
class Run:
    """What `run_to_completion` saw."""

    num_steps: int = 0
    prefill: dict[str, PrefillStats] = field(default_factory=dict)
    """Per request, the scheduler's record at admission: local and external cached tokens."""
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    """Per request, its KV block ids when last scheduled."""


class Step(NamedTuple):
    """A step as every worker sees it: sampled tokens per request, new KV rows per layer."""

    output: SchedulerOutput
    sampled: dict[str, list[int]]
    rows: list[torch.Tensor]
    metadata: MLACommonMetadata | None


StepWorkers = Callable[["Step"], list[ModelRunnerOutput]]
"""Runs one step on every worker: their outputs, in worker order."""


def in_process(
    workers: list[KVConnectorBase_V1],
    caches: list[dict[str, torch.Tensor]],
    on_layer: OnLayer | None = None,
) -> StepWorkers:
    """Workers stepped in this process, one after another (`caches[i]` is `workers[i]`'s)."""
    return lambda step: [
        worker_step(index, worker, caches[index], step, on_layer)
        for index, worker in enumerate(workers)
    ]


def run_to_completion(
    scheduler: Scheduler,
    step_workers: StepWorkers,
    num_workers: int,
    requests: list[Request],
    *,
    max_steps: int = 1000,
) -> Run:
    """Add the requests, then step scheduler and workers until the scheduler holds
    nothing: every request finished and no transfer pending."""
    by_id = {request.request_id: request for request in requests}
    for request in requests:
        scheduler.add_request(request)
    connector = scheduler.connector
    assert connector is not None
    aggregator = KVOutputAggregator.from_connector(connector, num_workers)
    num_layers = len(scheduler.kv_cache_config.kv_cache_groups[0].layer_names)
    run = Run()
    while scheduler.has_requests():
        if run.num_steps == max_steps:
            raise AssertionError(f"requests still held after {max_steps} steps")
        output = scheduler.schedule()
        for request_id in output.num_scheduled_tokens:  # prefill: recorded when first scheduled
            run.prefill.setdefault(request_id, copy(by_id[request_id].prefill_stats))
            run.block_ids[request_id] = scheduler.kv_cache_manager.get_block_ids(request_id)[0]
        step = _plan(output, run.block_ids, by_id, num_layers, scheduler.block_size)
        scheduler.update_from_output(output, aggregator.aggregate(step_workers(step)))
        run.num_steps += 1
    return run


def _plan(
    output: SchedulerOutput,
    block_ids: dict[str, list[int]],
    requests: dict[str, Request],
    num_layers: int,
    block_size: int,
) -> Step:
    """Lay out a step's tokens: their KV rows, slots and attention metadata."""
    cached = output.scheduled_cached_reqs
    starts = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    starts |= dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    sampled: dict[str, list[int]] = {}
    ends, tokens, slots = [], [], []
    for request_id, start in starts.items():
        request, blocks = requests[request_id], block_ids[request_id]
        end = start + output.num_scheduled_tokens[request_id]
        # Token 2 (not bos or eos); none for a prefill chunk but the last, as the runner does.
        sampled[request_id] = [2] if end >= request.num_tokens else []
        tokens += zip(request.all_token_ids[start:end], range(start, end), strict=True)
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]
        ends.append(end)
    if not ends:  # 0.32's kv_connector_no_forward: no attention metadata, no layers
        return Step(output, sampled, [], None)
    rows = [torch.stack([expected_row(*t, layer) for t in tokens]) for layer in range(num_layers)]
    query_lens = [0] + [end - start for end, start in zip(ends, starts.values(), strict=True)]
    metadata = MLACommonMetadata(  # the prefill/decode split is not modelled
        num_reqs=len(ends),
        max_query_len=max(query_lens),
        max_seq_len=max(ends),
        num_actual_tokens=len(slots),
        query_start_loc=torch.tensor(query_lens).cumsum(0, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=len(ends),
    )
    return Step(output, sampled, rows, metadata)


def transfer_results(connector: KVConnectorBase_V1, finished: set[str]) -> dict[str, Any]:
    """The finished transfers' fields of a step's KVConnectorOutput, as the version asks them."""
    if VLLM_0_26:
        sending, recving = connector.get_finished(finished)
        return {"finished_sending": sending, "finished_recving": recving}
    # finished_sending, finished_recving, failed_recving
    return vars(connector.get_transfer_results(finished))


def worker_step(
    index: int,
    connector: KVConnectorBase_V1,
    caches: dict[str, torch.Tensor],
    step: Step,
    on_layer: OnLayer | None,
) -> ModelRunnerOutput:
    """One worker's step in 0.32's model-runner order; its layers hold only `kv_cache`."""
    metadata, output = step.metadata, step.output
    context = ForwardContext(
        no_compile_layers={name: SimpleNamespace(kv_cache=kv) for name, kv in caches.items()},
        attn_metadata=dict.fromkeys(caches, metadata) if metadata else None,
        slot_mapping=dict.fromkeys(caches, metadata.slot_mapping) if metadata else {},
    )
    with override_forward_context(context):
        connector.bind_connector_metadata(output.kv_connector_metadata)
        sync_loads = VLLM_0_26 or output.has_sync_kv_loads
        if sync_loads:  # this step's forward reads them
            connector.start_load_kv(context)
        for layer, (name, kv) in enumerate(caches.items() if metadata else ()):
            connector.wait_for_layer_load(name)
            if on_layer is not None:
                on_layer(index, name, kv)
            rows, slots = step.rows[layer].to(kv.device), metadata.slot_mapping.to(kv.device)
            kv.view(-1, MLA_ROW)[slots] = rows
            connector.save_kv_layer(name, kv, metadata)
        if not sync_loads:  # 0.32 starts async loads once the forward is launched
            connector.start_load_kv(context)
        connector.wait_for_save()
        kv_output = KVConnectorOutput(
            **transfer_results(connector, output.finished_req_ids),
            invalid_block_ids=connector.get_block_ids_with_load_errors(),
            kv_connector_stats=connector.get_kv_connector_stats(),
            kv_cache_events=connector.get_kv_connector_kv_cache_events(),
            kv_connector_worker_meta=connector.build_connector_worker_meta(),
        )
        connector.clear_connector_metadata()
    return ModelRunnerOutput(
        req_ids=list(step.sampled),
        req_id_to_index={id: index for index, id in enumerate(step.sampled)},
        sampled_token_ids=list(step.sampled.values()),
        kv_connector_output=kv_output,
    )
