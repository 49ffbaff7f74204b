"""The job a vLLM connector runs: composed from `kv_connector_extra_config` ("overrides",
this project's Hydra overrides as on the command line; "config_dir", a deployment folder)
as the CLI composes it, with the model's geometry and the TP size taken from vLLM's own
config, then cross-checked: a value the overrides set otherwise is refused naming both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import vllm
from vllm.config import VllmConfig

import pipeline
from pipeline.config.job import Job

EXTRA_KEYS = ("overrides", "config_dir")
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
"""vLLM's model dtype -> `model.kv_dtype` (a KV cache of the model's dtype)."""


def vllm_geometry(config: VllmConfig) -> dict[str, Any]:
    """What vLLM says of the KV this job moves, as the job's keys name it; ValueError for a
    model that is not MLA (every TP rank must hold the same KV) or a KV dtype not known."""
    model, cache = config.model_config, config.cache_config
    if not model.use_mla:
        raise ValueError(
            f"kv_connector PipelineConnector: {model.model} is not an MLA model; this connector "
            "moves MLA/DSA KV, which every TP rank holds whole"
        )
    if cache.cache_dtype == "auto" and model.dtype in DTYPES:
        kv_dtype, width = DTYPES[model.dtype], model.dtype.itemsize
    elif cache.cache_dtype.startswith("fp8"):
        kv_dtype, width = "fp8", 1
    else:
        raise ValueError(
            f"kv_connector PipelineConnector: KV dtype {cache.cache_dtype} of a "
            f"{model.dtype} model: one of bf16, fp16 or fp8"
        )
    return {
        "model.kind": "mla",
        "model.num_layers": model.get_num_layers(config.parallel_config),
        "model.kv_row_bytes": model.get_head_size() * width,
        "model.kv_dtype": kv_dtype,
        "model.page_size": cache.block_size,
        "topology.tp_size": config.parallel_config.tensor_parallel_size,
        "topology.device": "cuda" if config.device_config.device_type == "cuda" else "cpu",
    }


def connector_job(config: VllmConfig) -> Job:
    """The checked job of vLLM's kv_transfer_config (ConfigError listing every problem of the
    overrides; ValueError for extra config that is not this connector's)."""
    transfer = config.kv_transfer_config
    extra = dict(transfer.kv_connector_extra_config if transfer is not None else {})
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise ValueError(
            f"kv_connector_extra_config: unknown keys {unknown}; PipelineConnector reads "
            f"{list(EXTRA_KEYS)}"
        )
    overrides = extra.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError(
            'kv_connector_extra_config: "overrides" is a list of strings, each an override as '
            'on the command line (e.g. ["storage=file", "storage.path=/srv/l3"])'
        )
    config_dir = extra.get("config_dir")
    if config_dir is not None and not isinstance(config_dir, str):
        raise ValueError('kv_connector_extra_config: "config_dir" is a folder\'s path')
    geometry = vllm_geometry(config)
    derived = [f"{key}={value}" for key, value in geometry.items()]
    job = pipeline.compose([*derived, *overrides], config_dir=config_dir)
    mismatched = [
        f"{key}={seen} (vLLM: {geometry[key]})"
        for key, seen in job_geometry(job).items()
        if str(seen) != str(geometry[key])
    ]
    if mismatched:
        raise ValueError(
            f"kv_connector_extra_config: the overrides set {', '.join(mismatched)}; leave "
            "them out, the connector takes them from vLLM"
        )
    return job


def hashes_seeded_at_random(environ: Mapping[str, str]) -> bool:
    """Whether vLLM seeds its block hashes' chain at random in each process (before 0.27,
    unless PYTHONHASHSEED is set): a store's blocks then hit only in the process that wrote
    them, never after a restart or in another engine."""
    return vllm.__version_tuple__[:2] < (0, 27) and "PYTHONHASHSEED" not in environ


def job_geometry(job: Job) -> dict[str, Any]:
    """The job's values of the keys `vllm_geometry` names."""
    model, topology = job.model, job.topology
    return {
        "model.kind": model.kind.value,
        "model.num_layers": model.num_layers,
        "model.kv_row_bytes": model.kv_row_bytes,
        "model.kv_dtype": model.kv_dtype.value,
        "model.page_size": model.page_size,
        "topology.tp_size": topology.tp_size,
        "topology.device": topology.device.value,
    }
