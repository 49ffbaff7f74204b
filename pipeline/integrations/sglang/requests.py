"""What a call from SGLang asks, checked before a byte moves: the host pages its slots name,
the share of the KV this rank holds, and what the backend does not support; and the
throughput SGLang's storage metrics report."""

from __future__ import annotations

import re
import threading
from typing import Any

import torch

PAGE_HASH = re.compile(r"[0-9a-f]{64}")
"""SGLang's page hash (0.5.23's `get_hash_str`): a SHA-256 over the page's tokens and the
hash before it, in lowercase hex."""


def page_hashes(keys: Any) -> list[str]:
    """SGLang's page hashes, checked: ValueError naming the first key that is not one (a key
    of another form would be stored, and found, under a key SGLang never makes)."""
    if not isinstance(keys, list | tuple):
        raise ValueError(f"keys: a list of SGLang's page hashes, got {type(keys).__name__}")
    for i, key in enumerate(keys):
        if not isinstance(key, str):
            raise ValueError(
                f"hashes[{i}]: a {type(key).__name__} is not a block hash (SGLang's page "
                "hashes are hex strings)"
            )
        if not PAGE_HASH.fullmatch(key):
            shown = key if len(key) <= 80 else f"{key[:80]}..."
            raise ValueError(
                f"hashes[{i}]={shown!r}: not an SGLang page hash (64 lowercase hex digits, a "
                "SHA-256 as its get_hash_str makes); pass SGLang's keys as they come"
            )
    return list(keys)


def host_pages(host_indices: Any, num_keys: int, page_size: int, num_pages: int) -> list[int]:
    """The host page of each key: `host_indices` are token slots, `page_size` a key, each
    key's slots one whole page of the pool; ValueError naming what is wrong otherwise."""
    if not isinstance(host_indices, torch.Tensor) or host_indices.dim() != 1:
        raise ValueError("host_indices: a 1-D tensor of host token slots, page_size per key")
    if host_indices.layout is not torch.strided or host_indices.device.type != "cpu":
        # a sparse tensor has no view of its slots, a meta one no values at all
        raise ValueError(
            "host_indices must be a dense CPU int64 tensor of token slots (got "
            f"{host_indices.layout} on {host_indices.device}), as SGLang's host pool allocates"
        )
    if host_indices.dtype.is_floating_point or host_indices.dtype == torch.bool:
        raise ValueError(f"host_indices: integer token slots, got {host_indices.dtype}")
    if host_indices.numel() != num_keys * page_size:
        raise ValueError(
            f"host_indices: {host_indices.numel()} slots for {num_keys} keys of {page_size}-token "
            "pages: pass page_size slots per key"
        )
    slots = host_indices.to("cpu", torch.int64).view(num_keys, page_size)
    starts = slots[:, 0]
    if num_keys and (
        (slots - starts[:, None] != torch.arange(page_size)).any() or (starts % page_size).any()
    ):
        raise ValueError(
            "host_indices: each key's slots must be one whole host page (page_size consecutive "
            "slots from a multiple of page_size)"
        )
    if num_keys and (starts.min() < 0 or starts.max() >= num_pages * page_size):
        raise ValueError(f"host_indices: slots outside the host pool's {num_pages * page_size}")
    pages = (starts // page_size).tolist()
    if len(set(pages)) != len(pages):
        raise ValueError("host_indices: a host page named twice in one call")
    return pages


def unsupported(config: Any) -> str | None:
    """Why this backend cannot serve SGLang's storage config, or None: the pages of context
    parallel and split heads are cut differently from a whole page of this rank's units."""
    if config.attn_cp_size > 1 or config.dcp_size > 1:
        return (
            "context parallel (attn_cp_size, dcp_size > 1): each rank holds a slice of every "
            "page, which this project's objects do not describe; use SGLang's file or mooncake"
        )
    if config.should_split_heads:
        return "tp_lcm_size with page_head (heads split per object): not supported"
    return None


def model_name(config: Any) -> str:
    """The name objects are keyed under: SGLang's served model, with the pipeline stage
    where there are several (each stage holds other layers)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", config.model_name or "sglang").strip("-")
    if config.pp_size > 1:
        name += f"-pp{config.pp_rank}of{config.pp_size}"
    return name or "sglang"


def share(config: Any, *, mla: bool) -> str:
    """Which share of a page's KV this rank holds ('' for MLA, whose ranks hold it whole;
    MHA: this rank's heads), as `PageObject.share` names it."""
    if mla or config.tp_size == 1:
        return ""
    return f"-s{config.tp_rank}of{config.tp_size}"


class Throughput:
    """Pages and GB/s of each batch call, kept until SGLang asks (`get_stats`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[list[int], list[float]]] = {
            "prefetch": ([], []),
            "backup": ([], []),
        }

    def add(self, kind: str, pages: int, object_bytes: int, seconds: float) -> None:
        if not pages:
            return
        with self._lock:
            self._kept[kind][0].append(pages)
            self._kept[kind][1].append(pages * object_bytes / max(seconds, 1e-9) / 1e9)

    def metrics(self) -> Any:
        """SGLang's `StorageMetrics` of the calls since the last ask (imported only here:
        its module needs SGLang's whole server)."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._lock:
            (fetched, fetch_rate), (stored, store_rate) = (
                self._kept["prefetch"],
                self._kept["backup"],
            )
            self._kept = {"prefetch": ([], []), "backup": ([], [])}
        return StorageMetrics(
            prefetch_pgs=fetched,
            backup_pgs=stored,
            prefetch_bandwidth=fetch_rate,
            backup_bandwidth=store_rate,
        )
