"""What `--hicache-storage-backend-extra-config` says to this backend, checked before a byte
moves: SGLang's own keys for its dynamic factory, and this project's store settings."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores.files import TIMEOUT_S

SGLANG_KEYS = (
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "tp_lcm_size",
    "prefetch_threshold",
    "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
)
"""The keys SGLang's dynamic factory and cache controllers read (most of them it removes
before the backend sees the config): left to SGLang."""
STORE_KEYS = (
    "kind",
    "path",
    "master",
    "metadata_server",
    "segment_bytes",
    "io_threads",
    "auth_key_file",
    "direct_io",
    "capacity_bytes",
    "evict_to",
    "model_revision",
    "tenant",
    "tenant_quota_bytes",
)
"""The `storage.*` settings (`pipeline.core.storage.StorageConfig`) that mean something to a
store SGLang drives: the rest are the project engine's (loads, prefetch, admission)."""
MODEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


@dataclass(frozen=True)
class Settings:
    """This backend's part of SGLang's extra config."""

    storage: StorageConfig
    """The store, as `storage.*` configures it for the project's own engine."""
    model: str | None
    """The model name objects are keyed under (None: SGLang's served model name)."""
    timeout_s: float
    """The longest a wait on the file store's lock or on a Mooncake master lasts."""


def settings(extra: dict[str, Any] | None) -> Settings:
    """The backend's settings from SGLang's extra config; ValueError naming the key and the
    fix for anything missing or unknown (the store's own checks raise ConfigError)."""
    extra = dict(extra or {})
    if not extra.get("interface_v1"):
        raise ValueError(
            'extra config: set "interface_v1": 1, so SGLang moves pages through '
            "batch_get_v1/batch_set_v1 (zero-copy); this backend has no other path"
        )
    unknown = sorted(set(extra) - {*SGLANG_KEYS, "storage", "model", "timeout_s"})
    if unknown:
        raise ValueError(
            f"extra config: unknown keys {unknown}; this backend reads 'storage', "
            "'model' and 'timeout_s' beside SGLang's own"
        )
    store = extra.get("storage")
    if not isinstance(store, dict):
        raise ValueError(
            'extra config: "storage" must be an object, e.g. {"kind": "file", "path": '
            '"/srv/l3"} or {"kind": "mooncake", "master": "host:50051", "metadata_server": '
            '"P2PHANDSHAKE"}'
        )
    return Settings(
        storage=storage_config(store),
        model=model_name(extra.get("model")),
        timeout_s=timeout(extra.get("timeout_s", TIMEOUT_S)),
    )


def storage_config(store: dict[str, Any]) -> StorageConfig:
    """The store's config from the "storage" object: file with a folder, or mooncake with
    a running master."""
    unknown = sorted(set(store) - set(STORE_KEYS))
    if unknown:
        raise ValueError(f"extra config: storage has unknown keys {unknown}; known: {STORE_KEYS}")
    kinds = [StorageKind.file.value, StorageKind.mooncake.value]
    if store.get("kind") not in kinds:
        raise ValueError(f"extra config: storage.kind={store.get('kind')!r}: one of {kinds}")
    fields = {f.name for f in dataclasses.fields(StorageConfig)}
    assert set(STORE_KEYS) <= fields, "every store key is a storage.* setting"
    config = StorageConfig(**{**store, "kind": StorageKind(store["kind"])})
    if config.kind is StorageKind.file and config.path is None:
        raise ValueError("extra config: storage.path: the folder of the file store's objects")
    if config.kind is StorageKind.mooncake and config.master == "auto":
        raise ValueError(
            "extra config: storage.master: the host:port of a running Mooncake master, and "
            "storage.metadata_server (its URL, or P2PHANDSHAKE); SGLang starts no master"
        )
    return config


def model_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not MODEL_NAME.fullmatch(value):
        raise ValueError(
            f"extra config: model={value!r}: letters, digits, '.', '_' and '-' (at most 128)"
        )
    return value


def timeout(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
        raise ValueError(f"extra config: timeout_s={value!r}: seconds, > 0")
    return float(value)
