"""vLLM 0.32.0's real v1 `Scheduler` and worker-side KV connectors, stepped on CPU as its own
connector unit tests step them (its tests/v1/kv_connector/unit/utils.py, offloading_connector/).

vLLM's own: configs (a tiny DeepSeek-V3: MLA, a 576-wide bf16 KV row per token and layer), KV
cache config and views, `Scheduler` (it builds the scheduler-side connector), connector factory
(worker side; both load `kv_connector_module_path`), `Request`, forward context, attention
metadata, outputs and their aggregator. The stand-in model runner, `run_to_completion`, calls the
worker connectors in 0.32's order and writes `expected_row(token, position, layer)` as KV."""

import json
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: pip install --no-deps -r .ci/vllm.txt")

from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.forward_context import ForwardContext, override_forward_context
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_kv_cache_config_from_groups,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.metrics.stats import PrefillStats
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.utils import allocate_kv_cache

MLA_ROW = 576
"""Elements in one MLA KV row: kv_lora_rank 512 + qk_rope_head_dim 64."""
LAYER_NAME = "model.layers.{}.self_attn.attn"
"""An attention layer's name in vLLM's DeepSeek-V3 model (`LAYER_NAME.format(layer)`)."""
LAYOUT = "LBNHC"
"""The KV cache layout vLLM's connector tests pre-set: each layer's blocks in one run."""
TINY_DSV3 = {
    **{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"},
    **{"hidden_size": 64, "intermediate_size": 128, "vocab_size": 1024, "rope_theta": 10000.0},
    **{"num_attention_heads": 4, "num_key_value_heads": 4, "bos_token_id": 0, "eos_token_id": 1},
    **{"kv_lora_rank": 512, "qk_rope_head_dim": 64},
}
"""A DeepSeek-V3 config.json less its layer count; only the attention shapes matter."""
OnLayer = Callable[[int, str, torch.Tensor], None]
"""(worker index, layer name, its KV view): called where attention would read the layer."""


def tiny_model_dir(root: Path, num_layers: int = 2) -> Path:
    """Write root/tiny-dsv3/config.json; `first_k_dense_replace` = the layer count keeps MoE out."""
    model_dir = root / "tiny-dsv3"
    model_dir.mkdir(parents=True, exist_ok=True)
    layers = {"num_hidden_layers": num_layers, "first_k_dense_replace": num_layers}
    (model_dir / "config.json").write_text(json.dumps(TINY_DSV3 | layers))
    return model_dir


def vllm_config(
    model_dir: Path,
    *,
    connector: str,
    module_path: str,
    extra: dict[str, Any],
    block_size: int = 16,
    num_blocks: int = 64,
    max_num_batched_tokens: int = 256,
) -> VllmConfig:
    """A VllmConfig naming the connector and its module (kv_both), prefix caching on, sync
    scheduling. The first runs vLLM's ~8 s model inspection (cached in $VLLM_CACHE_ROOT)."""
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16")
    cache = CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks)
    cache.kv_cache_layout = LAYOUT
    return VllmConfig(
        model_config=model,
        cache_config=cache,
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,  # as vLLM's connector tests; max_num_batched_tokens must be >= it
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=model.max_model_len,
            is_encoder_decoder=False,
            async_scheduling=False,
        ),
        kv_transfer_config=KVTransferConfig(
            kv_connector=connector,
            kv_connector_module_path=module_path,
            kv_role="kv_both",
            kv_connector_extra_config=extra,
        ),
        device_config=DeviceConfig("cpu"),
    )


def make_scheduler(config: VllmConfig) -> tuple[Scheduler, KVCacheConfig]:
    """vLLM's Scheduler over one MLA cache group of all layers, and that KVCacheConfig; the
    scheduler builds its connector itself (`scheduler.connector`)."""
    num_layers = config.model_config.get_num_layers(config.parallel_config)
    block_size = config.cache_config.block_size
    spec = MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=MLA_ROW, dtype=torch.bfloat16
    )
    group = KVCacheGroupSpec([LAYER_NAME.format(i) for i in range(num_layers)], spec)
    num_bytes = config.cache_config.num_gpu_blocks_override * num_layers * spec.page_size_bytes
    kv_cache_config = get_kv_cache_config_from_groups(config, [group], num_bytes)
    kv_cache_config.kv_cache_layout = LAYOUT
    config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    structured_output = StructuredOutputManager(config)
    scheduler = Scheduler(config, kv_cache_config, structured_output, block_size, log_stats=True)
    return scheduler, kv_cache_config


def make_worker(
    config: VllmConfig, kv_cache_config: KVCacheConfig
) -> tuple[KVConnectorBase_V1, dict[str, torch.Tensor]]:
    """A worker-role connector from vLLM's factory, and its zeroed CPU KV cache, allocated and
    registered as vLLM does: layer name -> bf16 `[num_blocks, 1, block_size, 576]` view."""
    caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), KVCacheLayout[LAYOUT])
    connector = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache_config)
    assert isinstance(connector, KVConnectorBase_V1)
    connector.register_kv_caches(caches)
    return connector, caches


def make_request(
    request_id: str, token_ids: list[int], block_size: int = 16, max_tokens: int = 1
) -> Request:
    """A vLLM Request with sha256 block hashes that stops after `max_tokens` tokens."""
    init_none_hash(sha256)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        pooling_params=None,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def expected_row(token_id: int, position: int, layer: int) -> torch.Tensor:
    """The KV row the stand-in model computes: base-256 digits of token id, position and layer
    (integers below 256 are exact in bf16, so rows differ), then a ramp seeded by all three."""
    head = [(value >> s) & 255 for value in (token_id, position) for s in (16, 8, 0)] + [layer]
    seed = token_id * 7 + position * 13 + layer * 101
    tail = (torch.arange(MLA_ROW - len(head)) + seed) % 251 - 125
    return torch.cat([torch.tensor(head), tail]).to(torch.bfloat16)


@dataclass
class Run:
    """What `run_to_completion` saw."""

    num_steps: int = 0
    prefill: dict[str, PrefillStats] = field(default_factory=dict)
    """Per request, the scheduler's record at admission: local and external cached tokens."""
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    """Per request, its KV block ids when last scheduled."""


class _Step(NamedTuple):
    """A step as every worker sees it: sampled tokens per request, new KV rows per layer."""

    output: SchedulerOutput
    sampled: dict[str, list[int]]
    rows: list[torch.Tensor]
    metadata: MLACommonMetadata | None


def run_to_completion(
    scheduler: Scheduler,
    workers: list[KVConnectorBase_V1],
    caches: list[dict[str, torch.Tensor]],
    requests: list[Request],
    *,
    on_layer: OnLayer | None = None,
    max_steps: int = 1000,
) -> Run:
    """Add the requests, then step scheduler and workers (`caches[i]` is `workers[i]`'s) until
    the scheduler holds nothing: every request finished and no transfer pending."""
    by_id = {request.request_id: request for request in requests}
    for request in requests:
        scheduler.add_request(request)
    aggregator = KVOutputAggregator.from_connector(workers[0], len(workers))
    run = Run()
    while scheduler.has_requests():
        if run.num_steps == max_steps:
            raise AssertionError(f"requests still held after {max_steps} steps")
        output = scheduler.schedule()
        for request_id in output.num_scheduled_tokens:  # prefill: recorded when first scheduled
            run.prefill.setdefault(request_id, copy(by_id[request_id].prefill_stats))
            run.block_ids[request_id] = scheduler.kv_cache_manager.get_block_ids(request_id)[0]
        step = _plan(output, run.block_ids, by_id, len(caches[0]), scheduler.block_size)
        outputs = [
            _worker_step(index, worker, caches[index], step, on_layer)
            for index, worker in enumerate(workers)
        ]
        scheduler.update_from_output(output, aggregator.aggregate(outputs))
        run.num_steps += 1
    return run


def _plan(
    output: SchedulerOutput,
    block_ids: dict[str, list[int]],
    requests: dict[str, Request],
    num_layers: int,
    block_size: int,
) -> _Step:
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
        return _Step(output, sampled, [], None)
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
    return _Step(output, sampled, rows, metadata)


def _worker_step(
    index: int,
    connector: KVConnectorBase_V1,
    caches: dict[str, torch.Tensor],
    step: _Step,
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
        if output.has_sync_kv_loads:  # this step's forward reads them
            connector.start_load_kv(context)
        for layer, (name, kv) in enumerate(caches.items() if metadata else ()):
            connector.wait_for_layer_load(name)
            if on_layer is not None:
                on_layer(index, name, kv)
            kv.view(-1, MLA_ROW)[metadata.slot_mapping] = step.rows[layer]
            connector.save_kv_layer(name, kv, metadata)
        if not output.has_sync_kv_loads:  # 0.32 starts async loads once the forward is launched
            connector.start_load_kv(context)
        connector.wait_for_save()
        transfers = connector.get_transfer_results(output.finished_req_ids)
        kv_output = KVConnectorOutput(
            **vars(transfers),  # finished_sending, finished_recving, failed_recving
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
