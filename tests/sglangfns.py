"""SGLang for the tests of `pipeline.integrations.sglang`: its storage interface imported, and
host pools of its buffer shapes.

What is SGLang's own code in those tests: `HiCacheStorage`, `HiCacheStorageConfig` and
`StorageBackendFactory` (it builds the backend from the extra config, as its cache
controller does). What stands in for it: the host pool. SGLang's `MLATokenToKVPoolHost` and
`MHATokenToKVPoolHost` import its GPU kernels and model configs and take the device pool's
buffers to be built, so they cannot be made on a CPU machine with `--no-deps` SGLang;
`HostPool` below allocates `kv_buffer` with the exact dims of their `init_kv_buffer` for
each layout (sglang/srt/mem_cache/pool_host/mla.py and mha.py, 0.5.23) and reads a page as
their `get_data_page` does. The device (GPU) pool and the device<->host copies are not
exercised: L3 moves only host pages.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pytest
import torch


def import_sglang() -> None:
    """Import SGLang's storage interface; skip the module's tests where it is not installed
    (`.ci/run` installs it, so there they run)."""
    try:
        importlib.import_module("sglang.srt.mem_cache.storage.backend_factory")
    except ImportError as e:
        pytest.skip(
            f"needs SGLang's storage interface ({e}): pip install --no-deps sglang==0.5.23 "
            "&& pip install -e '.[sglang]'",
            allow_module_level=True,
        )


@dataclass
class HostPool:
    """A host pool of SGLang's buffer shapes: `kv_buffer` as its `init_kv_buffer` makes it.
    Made by `host_pool`, as a class named after the SGLang pool it stands for (the backend
    serves exactly those)."""

    layout: str
    mla: bool
    page_num: int
    page_size: int
    layer_num: int
    dtype: torch.dtype = torch.bfloat16
    kv_cache_dim: int = 32  # MLA: kv_lora_rank + qk_rope_head_dim
    head_num: int = 2  # MHA: this rank's heads
    head_dim: int = 8

    def __post_init__(self) -> None:
        self.size = self.page_num * self.page_size
        self.kv_buffer = torch.zeros(self.dims(), dtype=self.dtype)

    def dims(self) -> tuple[int, ...]:
        """SGLang's `init_kv_buffer` dims, MLA then MHA, per layout."""
        n, p, layers = self.page_num, self.page_size, self.layer_num
        if self.mla:
            row = (1, self.kv_cache_dim)
            return {
                "layer_first": (layers, self.size, *row),
                "page_first": (self.size, layers, *row),
                "page_first_direct": (n, layers, p, *row),
                "page_head": (n, 1, p, layers, self.kv_cache_dim),  # refused: not an MLA layout
            }[self.layout]
        heads = (self.head_num, self.head_dim)
        return {
            "layer_first": (2, layers, self.size, *heads),
            "page_first": (2, self.size, layers, *heads),
            "page_first_direct": (2, n, layers, p, *heads),
            "page_head": (2, n, self.head_num, p, layers, self.head_dim),
        }[self.layout]

    def data_page(self, index: int) -> torch.Tensor:
        """The page at token slot `index`, as SGLang's `get_data_page(index, flat=False)`."""
        p, lead = self.page_size, () if self.mla else (slice(None),)
        if self.layout == "layer_first":
            return self.kv_buffer[(*lead, slice(None), slice(index, index + p))]
        if self.layout == "page_first":
            return self.kv_buffer[(*lead, slice(index, index + p))]
        return self.kv_buffer[(*lead, slice(index // p, index // p + 1))]

    def layer_rows(self, page: int) -> torch.Tensor:
        """The page's bytes as [K/V, layer, token, row bytes], whatever the layout: what two
        pools of different layouts must agree on."""
        page_view = self.data_page(page * self.page_size)
        if not self.mla and self.layout == "page_first":  # [2, tokens, layers, heads, dim]
            page_view = page_view.transpose(1, 2)
        elif not self.mla and self.layout == "page_first_direct":  # [2, 1, layers, p, ...]
            page_view = page_view[:, 0]
        elif self.mla and self.layout == "page_first":  # [tokens, layers, 1, dim]
            page_view = page_view.transpose(0, 1)
        elif self.mla and self.layout == "page_first_direct":  # [1, layers, p, 1, dim]
            page_view = page_view[0]
        rows = page_view.contiguous().view(torch.uint8)
        return rows.reshape(1 if self.mla else 2, self.layer_num, self.page_size, -1)

    def fill(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        flat = self.kv_buffer.view(-1).view(torch.uint8)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=generator))


class MLATokenToKVPoolHost(HostPool):
    """Stands in for SGLang's MLA host pool."""


class MHATokenToKVPoolHost(HostPool):
    """Stands in for SGLang's MHA host pool."""


def host_pool(layout: str, mla: bool, **sizes: Any) -> HostPool:
    """A stand-in of SGLang's MLA (or MHA) host pool of this layout."""
    kind = MLATokenToKVPoolHost if mla else MHATokenToKVPoolHost
    return kind(layout, mla, **sizes)


def slots(pages: list[int], page_size: int) -> torch.Tensor:
    """The host token slots of `pages`, as SGLang's controller passes `host_indices`."""
    return torch.cat([torch.arange(p * page_size, (p + 1) * page_size) for p in pages])


def built(config: dict[str, Any], pool: HostPool, *, mla: bool = True, **fields: Any) -> Any:
    """The backend as SGLang's cache controller makes it: SGLang's own factory from the extra
    config, then the host pool registered (`fields` replace HiCacheStorageConfig's)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    values = dict(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=pool.layout == "page_first",
        model_name="org/model",
    )
    storage_config = HiCacheStorageConfig(**{**values, **fields}, extra_config=config)
    backend = StorageBackendFactory.create_backend("dynamic", storage_config, pool)
    backend.register_mem_pool_host(pool)
    return backend
