"""What `--hicache-storage-backend-extra-config` says to this backend, checked before a byte
moves: SGLang's own keys for its dynamic factory, and this project's store settings."""

from __future__ import annotations

import dataclasses
import json
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
STORE_TYPES = {
    "kind": "text",
    "path": "text",
    "master": "text",
    "metadata_server": "text",
    "segment_bytes": "whole",
    "io_threads": "whole",
    "auth_key_file": "text",
    "direct_io": "bool",
    "capacity_bytes": "size",
    "evict_to": "number",
    "model_revision": "text",
    "tenant": "text",
    "tenant_quota_bytes": "whole",
    "stream_layers": "whole",
}
"""The `storage.*` settings (`pipeline.core.storage.StorageConfig`) that mean something to a
store SGLang drives (`stream_layers`: where Mooncake's objects are cut, as the engine's; the
rest are the project engine's: loads, prefetch, admission), each with the JSON type it takes
(`type_problem` says what each name means)."""
STORE_KEYS = tuple(STORE_TYPES)
OPTIONAL = ("path", "metadata_server", "auth_key_file", "capacity_bytes", "stream_layers")
"""Store keys that may be null: their default (a missing path or master is then said)."""
EXAMPLES = {
    "kind": "file",
    "path": "/srv/l3",
    "master": "10.0.0.5:50051",
    "metadata_server": "P2PHANDSHAKE",
    "auth_key_file": "/etc/hicache/l3.key",
    "model_revision": "ckpt-7f3a",
    "tenant": "acme",
}
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
    v1 = extra.get("interface_v1")
    # SGLang reads it as bool(value): "0" would turn its v1 path on, so only 0/1 are taken
    if v1 is not None and (not isinstance(v1, int) or v1 not in (0, 1)):
        raise ValueError(
            f"extra config: interface_v1={v1!r}: 0 or 1 (a JSON number or boolean, not a "
            'string); set "interface_v1": 1'
        )
    if not v1:
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
    for key, value in store.items():
        if key != "kind" and (problem := type_problem(key, value)) is not None:
            raise ValueError(f"extra config: storage.{key}={shown(value)}: {problem}")
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


def type_problem(key: str, value: object) -> str | None:
    """What a store setting of `value`'s JSON type must be instead (None: the right type). A
    JSON string is never read as a boolean or a number: "false" would be true."""
    kind = STORE_TYPES[key]
    if value is None and key in OPTIONAL:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool" and not isinstance(value, bool):
        return "true or false (a JSON boolean, not a string or a number)"
    if kind == "whole" and not (number and isinstance(value, int)):
        return "a whole number (a JSON number, not a string)"
    if kind == "number" and not number:
        return "a number (a JSON number, not a string)"
    if kind == "size" and not (isinstance(value, str) or (number and isinstance(value, int))):
        return 'a size: a whole number of bytes, or a string such as "2TiB"'
    if kind == "text" and not isinstance(value, str):
        return f"a string (e.g. {json.dumps(EXAMPLES[key])})"
    return None


def shown(value: object) -> str:
    """`value` as the JSON that gave it."""
    return json.dumps(value, default=repr)


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
