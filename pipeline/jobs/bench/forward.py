"""The ttft bench's synthetic forward pass: per layer, matmuls whose FLOPs follow from the
model's published config, issued on the forward stream after that layer's load event.

Per layer and rank, for `new` tokens over a cached prefix of `prefix` tokens:
- one GEMM [new, hidden] x [hidden, params / hidden, rounded up to ALIGN]: 2 x params x new
  FLOPs (under 0.1 % more for deepseek_v3, from the rounding), where
  params are the layer's weights one token passes through on one rank (its attention
  projections, and its dense MLP or its routed + shared experts), the head- and
  expert-parallel ones split over the published serving TP size;
- attention in MLA's absorbed form over the latent cache (what the cache holds): per query
  block, scores = q [heads x block, kv_lora + rope] x keys^T over the prefix and the new tokens
  up to the block's end (causal at block granularity), then scores x the keys' latent part
  [.., kv_lora]: 2 x heads x keys x (2 kv_lora + rope) FLOPs per query token;
- first, a sum over every byte of the layer's loaded pages, so each layer's work reads what
  its load event promised (its digest, compared with the bytes backed up).
The matmuls work on buffers of their own (the values are not the model's); the forward runs
no collective (a TP forward's all-reduces are not modelled).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from pipeline.core.checks import ConfigError, Problem
from pipeline.core.model import ModelGeometry
from pipeline.engine.cuda.streams import Stream
from pipeline.engine.l3.handles import Loading

TOKEN_CHUNK = 8192
"""New tokens per GEMM (a chunked prefill's chunk): bounds the activations of a recompute."""
SCORE_ELEMENTS = 1 << 28
"""Most attention scores held at once (512 MiB in bf16): sets the query block."""
ALIGN = 128
"""GEMM columns and query blocks (in tokens) come in multiples of this: an odd leading
dimension or row count sends cuBLAS to kernels several times slower than a real model's
(measured at 117-275 TFLOP/s on an H200 before this rounding)."""


@dataclass(frozen=True, kw_only=True)
class PublishedConfig:
    """What a model's published config says about its compute (not its KV cache)."""

    source: str
    """Where the numbers come from."""
    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    dense_layers: int
    """The first layers, which have a dense MLP instead of experts."""
    dense_intermediate: int
    moe_intermediate: int
    experts_per_token: int
    """Routed experts per token plus shared experts."""
    routed_experts: int
    """Experts the router scores (its weight is one column per expert)."""
    serving_tp: int
    """GPUs whose TP group the model is served on: each rank computes this share."""

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.serving_tp

    @property
    def key_dim(self) -> int:
        """The latent cache's row: the compressed KV plus the rope part."""
        return self.kv_lora_rank + self.qk_rope_dim

    def layer_params(self, layer: int) -> int:
        """Weights one token passes through in `layer` on one rank: the down-projections (and
        the router) on every rank, the per-head and per-expert ones split over serving_tp."""
        everyone = self.hidden * (self.q_lora_rank + self.key_dim)
        split = self.heads * (
            self.q_lora_rank * (self.qk_nope_dim + self.qk_rope_dim)
            + self.kv_lora_rank * (self.qk_nope_dim + self.v_head_dim)
            + self.v_head_dim * self.hidden
        )
        if layer < self.dense_layers:
            split += 3 * self.hidden * self.dense_intermediate
        else:
            everyone += self.hidden * self.routed_experts
            split += self.experts_per_token * 3 * self.hidden * self.moe_intermediate
        return everyone + split // self.serving_tp

    def gemm_columns(self, layer: int) -> int:
        return math.ceil(self.layer_params(layer) / self.hidden / ALIGN) * ALIGN


DEEPSEEK_V3 = PublishedConfig(
    source="deepseek-ai/DeepSeek-V3 config.json; served TP8 on one 8-GPU node",
    hidden=7168,
    heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_dim=128,
    qk_rope_dim=64,
    v_head_dim=128,
    dense_layers=3,
    dense_intermediate=18432,
    moe_intermediate=2048,
    experts_per_token=8 + 1,
    routed_experts=256,
    serving_tp=8,
)
TINY = PublishedConfig(  # its 32-element latent row is tiny_mla's 64 B bf16 KV row
    source="a tiny MLA model for CPU tests, one rank's whole model",
    hidden=64,
    heads=4,
    q_lora_rank=32,
    kv_lora_rank=24,
    qk_nope_dim=16,
    qk_rope_dim=8,
    v_head_dim=16,
    dense_layers=1,
    dense_intermediate=128,
    moe_intermediate=32,
    experts_per_token=2 + 1,
    routed_experts=8,
    serving_tp=1,
)
PUBLISHED = {"deepseek_v3": DEEPSEEK_V3, "deepseek_v3_fp8": DEEPSEEK_V3, "tiny_mla": TINY}
"""The models whose compute the ttft bench knows (their KV geometry is the model config's)."""


def published_config(model: ModelGeometry) -> PublishedConfig:
    """The model's published compute config; ConfigError naming `model` for one it lacks."""
    if model.name not in PUBLISHED:
        known = ", ".join(sorted(PUBLISHED))
        message = f"model={model.name}: the ttft bench knows the compute of {known} only"
        raise ConfigError([Problem("model", message)])
    return PUBLISHED[model.name]


def query_blocks(config: PublishedConfig, prefix: int, new: int) -> list[tuple[int, int]]:
    """(start, stop) of each block of new tokens whose scores are computed at once."""
    block = max(1, min(new, SCORE_ELEMENTS // (config.heads_per_rank * (prefix + new))))
    if block > ALIGN:
        block -= block % ALIGN
    return [(start, min(start + block, new)) for start in range(0, new, block)]


def forward_flops(config: PublishedConfig, num_layers: int, prefix: int, new: int) -> int:
    """The matmul FLOPs of one synthetic forward (what `SyntheticForward.run` issues)."""
    heads, key_dim, value_dim = config.heads_per_rank, config.key_dim, config.kv_lora_rank
    attention = sum(
        2 * heads * (stop - start) * (prefix + stop) * (key_dim + value_dim)
        for start, stop in query_blocks(config, prefix, new)
    )
    gemms = sum(2 * new * config.hidden * config.gemm_columns(i) for i in range(num_layers))
    return gemms + num_layers * attention


class SyntheticForward:
    """One forward's buffers for `new` tokens over `prefix` cached ones (allocated up front,
    outside any timed region); `run` issues it."""

    def __init__(
        self,
        config: PublishedConfig,
        num_layers: int,
        device: torch.device,
        *,
        prefix: int,
        new: int,
    ) -> None:
        self.config, self.num_layers, self.prefix, self.new = config, num_layers, prefix, new
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        columns = max(config.gemm_columns(i) for i in range(num_layers))
        generator = torch.Generator(device=device).manual_seed(0)

        def randn(*shape: int) -> torch.Tensor:  # small values: no sum overflows bf16
            return 0.05 * torch.randn(shape, generator=generator, device=device, dtype=dtype)

        self.weight = randn(config.hidden, columns)
        self.activations = randn(new, config.hidden)
        self.keys = randn(prefix + new, config.key_dim)
        self.blocks = query_blocks(config, prefix, new)
        widest = max(stop - start for start, stop in self.blocks)
        self.queries = randn(config.heads_per_rank * widest, config.key_dim)
        self.flops = 0
        """FLOPs of the matmuls issued so far (counted from their shapes)."""

    def run(
        self,
        forward: Stream,
        loading: Loading | None,
        loaded: list[list[torch.Tensor]] | None,
        order: list[tuple[str, int]] | None = None,
    ) -> list[torch.Tensor]:
        """Every layer on `forward`, each after `loading.wait(layer)` (None: nothing to wait
        for); a digest of each layer's `loaded` pages (None: nothing loaded, no digest).
        `order` gets ("wait", layer) and ("compute", layer) as they are issued."""
        digests: list[torch.Tensor] = []
        for layer in range(self.num_layers):
            if loading is not None:
                loading.wait(layer, forward)
                if order is not None:
                    order.append(("wait", layer))
            pages = None if loaded is None else loaded[layer]
            forward.submit(functools.partial(self.layer, layer, pages, digests))
            if order is not None:
                order.append(("compute", layer))
        return digests

    def layer(
        self, layer: int, pages: list[torch.Tensor] | None, digests: list[torch.Tensor]
    ) -> None:
        """One layer's work on the current stream (`run` issues it on the forward stream,
        after the layer's wait): the digest of its `pages`, appended to `digests`, then its
        matmuls."""
        if pages is not None:
            sums = [p.view(torch.uint8).sum(dtype=torch.int64) for p in pages]
            digests.append(torch.stack(sums).sum())
        weight = self.weight[:, : self.config.gemm_columns(layer)]
        for start in range(0, self.new, TOKEN_CHUNK):
            rows = self.activations[start : start + TOKEN_CHUNK]
            torch.mm(rows, weight)
            self.flops += 2 * rows.shape[0] * rows.shape[1] * weight.shape[1]
        heads, value_dim = self.config.heads_per_rank, self.config.kv_lora_rank
        for start, stop in self.blocks:
            queries = self.queries[: heads * (stop - start)]
            keys = self.keys[: self.prefix + stop]
            scores = torch.mm(queries, keys.T)
            torch.mm(scores, keys[:, :value_dim])
            self.flops += 2 * scores.numel() * (keys.shape[1] + value_dim)
