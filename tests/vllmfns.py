"""vLLM 0.32.0's real v1 `Scheduler` and worker-side KV connectors, stepped on CPU as its own
connector unit tests step them (its tests/v1/kv_connector/unit/utils.py, offloading_connector/).

vLLM's own: configs (a tiny DeepSeek-V3: MLA, a 576-wide bf16 KV row per token and layer), KV
cache config and views, `Scheduler` (it builds the scheduler-side connector), connector factory
(worker side; both load `kv_connector_module_path`), `Request`, forward context, attention
metadata, outputs and their aggregator. The stand-in model runner, `run_to_completion`, calls the
worker connectors in 0.32's order and writes `expected_row(token, position, layer)` as KV."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm", reason="needs vLLM: pip install --no-deps -r .ci/vllm.txt")

import vllm
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    get_kv_cache_config_from_groups,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

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
VLLM_0_26 = vllm.__version_tuple__[:2] < (0, 27)
"""vLLM 0.26 (the one matching the GPU host's torch 2.11) against 0.32 (CI's): no KV cache
layouts (its MLA caches are `[blocks, block_size, 576]` per layer), every load started before
the forward, `get_finished` for the transfer results."""
OnLayer = Callable[[int, str, torch.Tensor], None]
"""(worker index, layer name, its KV view): called where attention would read the layer."""


# vLLM seeds its block hashes' chain once per process, as its engine does (0.26 draws the
# seed at random unless PYTHONHASHSEED is set; 0.32 derives it from sha256)
init_none_hash(sha256)


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
    tensor_parallel_size: int = 1,
    load_failure_policy: str = "fail",
    events_port: int | None = None,
    device: str = "cpu",
) -> VllmConfig:
    """A VllmConfig naming the connector and its module (kv_both), prefix caching on, sync
    scheduling. The first runs vLLM's ~8 s model inspection (cached in $VLLM_CACHE_ROOT)."""
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16")
    cache = CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks)
    if not VLLM_0_26:
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
            kv_load_failure_policy=load_failure_policy,
        ),
        device_config=DeviceConfig(device),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        kv_events_config=None if events_port is None else events_at(events_port),
    )


def events_at(port: int) -> KVEventsConfig:
    """vLLM's own KV-event publisher on loopback: PUB on `port`, replay on `port` + 1."""
    return KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://127.0.0.1:{port}",
        replay_endpoint=f"tcp://127.0.0.1:{port + 1}",
    )


def kv_cache_config_of(config: VllmConfig) -> KVCacheConfig:
    """One MLA cache group of all layers, as vLLM sizes it (the same in every process)."""
    num_layers = config.model_config.get_num_layers(config.parallel_config)
    spec = MLAAttentionSpec(
        block_size=config.cache_config.block_size,
        num_kv_heads=1,
        head_size=MLA_ROW,
        dtype=torch.bfloat16,
    )
    group = KVCacheGroupSpec([LAYER_NAME.format(i) for i in range(num_layers)], spec)
    num_bytes = config.cache_config.num_gpu_blocks_override * num_layers * spec.page_size_bytes
    kv_cache_config = get_kv_cache_config_from_groups(config, [group], num_bytes)
    if not VLLM_0_26:
        kv_cache_config.kv_cache_layout = LAYOUT
    config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    return kv_cache_config


def make_scheduler(config: VllmConfig) -> tuple[Scheduler, KVCacheConfig]:
    """vLLM's Scheduler over `kv_cache_config_of(config)`, and that config; the scheduler
    builds its connector itself (`scheduler.connector`)."""
    kv_cache_config = kv_cache_config_of(config)
    structured_output = StructuredOutputManager(config)
    block_size = config.cache_config.block_size
    scheduler = Scheduler(config, kv_cache_config, structured_output, block_size, log_stats=True)
    return scheduler, kv_cache_config


def make_worker(
    config: VllmConfig, kv_cache_config: KVCacheConfig
) -> tuple[KVConnectorBase_V1, dict[str, torch.Tensor]]:
    """A worker-role connector from vLLM's factory, and its zeroed KV cache on the config's
    device, allocated and registered as vLLM does: layer name -> bf16 `[num_blocks, 1,
    block_size, 576]` view."""
    device = torch.device(config.device_config.device_type)
    caches = kv_caches(kv_cache_config, device)
    connector = KVConnectorFactory.create_connector(config, KVConnectorRole.WORKER, kv_cache_config)
    assert isinstance(connector, KVConnectorBase_V1)
    connector.register_kv_caches(caches)
    return connector, caches


def kv_caches(kv_cache_config: KVCacheConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """vLLM's own allocation on CPU (0.32); on a GPU, or with 0.26 (no layouts), the per-layer
    shape vLLM gives made here: 0.32's allocator imports its flash-attention extension, which
    the device carries no build of. 0.32: `[blocks, 1, block_size, 576]`; 0.26 (its
    `MLACommonBackend.get_kv_cache_shape`): `[blocks, block_size, 576]`."""
    (group,) = kv_cache_config.kv_cache_groups
    block_size = group.kv_cache_spec.block_size
    if VLLM_0_26:
        from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend

        shape = MLACommonBackend.get_kv_cache_shape(
            kv_cache_config.num_blocks, block_size, 1, MLA_ROW
        )
    elif device.type == "cpu":
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import allocate_kv_cache

        return allocate_kv_cache(kv_cache_config, device, KVCacheLayout[LAYOUT])
    else:
        shape = (kv_cache_config.num_blocks, 1, block_size, MLA_ROW)
    return {
        name: torch.zeros(shape, dtype=torch.bfloat16, device=device) for name in group.layer_names
    }


def make_request(
    request_id: str, token_ids: list[int], block_size: int = 16, max_tokens: int = 1
) -> Request:
    """A vLLM Request with sha256 block hashes that stops after `max_tokens` tokens."""
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


def check_rows(seen: dict[str, torch.Tensor], block_ids: list[int], tokens: list[int]) -> None:
    """Each of `tokens`' rows in every layer's KV (`seen`: layer name -> vLLM's cache as the
    layer's wait returned it) is the one the stand-in forward wrote for it."""
    assert len(seen) > 0
    for layer, kv in enumerate(seen.values()):
        rows = kv.cpu().view(kv.shape[0], -1, MLA_ROW)  # [blocks, block_size, row]
        block_size = rows.shape[1]
        for position, token in enumerate(tokens):
            block, offset = block_ids[position // block_size], position % block_size
            expected = expected_row(token, position, layer)
            assert torch.equal(rows[block, offset], expected), (layer, position)
