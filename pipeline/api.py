"""Use from a serving engine: one rank's transfer engine inside the caller's own processes.

The caller starts its ranks (torchrun, or its own launcher) and the default process group,
whose ranks are the TP ranks of one pipeline stage (rank r is TP rank r). Then, on each rank:

    job = pipeline.compose(["model=deepseek_v3", "topology=tp2", "strategy=rotating"])
    engine = pipeline.create_engine(job, device_kv=kv)  # kv: your KV tensors, or None

`compose` runs the checks the command line runs (every problem at once, before a byte
moves); `create_engine` makes this rank's groups, streams and pools. Index tensors of
`Engine.backup` / `Engine.load` hold token slots (CPU int64, whole pages: page p is slots
p*page_size .. p*page_size+page_size-1), never KV data.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from pipeline.config.app import CommandLine, checked_session, configs
from pipeline.config.job import Job
from pipeline.engine.adopt import Adopted
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.spec.storage import StorageKind


def compose(
    overrides: Sequence[str] = (),
    *,
    config_dir: str | None = None,
    allowed_endpoints: Sequence[str] = (),
) -> Job:
    """The checked config for these overrides (Hydra's grammar, as on the command line) and
    your own config folder, if any (`allowed_endpoints`: store addresses its files may name,
    as `--allow-endpoint`); ConfigError listing every problem otherwise."""
    line = CommandLine(overrides=list(overrides), config_dir=config_dir)
    with configs(config_dir, allowed_endpoints) as sources:
        return checked_session(line, sources).job()


def create_engine(
    job: Job,
    *,
    device_kv: Adopted | None = None,
    local_rank: int | None = None,
) -> Engine:
    """This rank's engine in the caller's default process group (initialized first, one rank
    per TP rank). `device_kv`: the caller's device KV tensors, adopted instead of allocating
    (the job's `workload.device_tokens` is then taken from them): one per ("kv" or "index",
    layer), each [pages, page_size, row elements] of the KV dtype (index: uint8; vLLM's
    [blocks, block_size, dim] where a block is a page) or SGLang's [tokens, 1, dim]; or one
    stacked [layers, pages, page_size, dim] per pool kind ("kv", "index"). See
    `pipeline.engine.adopt`: nothing is copied, and what does not fit is refused saying why.
    `local_rank`: the GPU to use (default: rank modulo the GPUs here). `engine.close()`
    leaves the caller's process group alone."""
    if not dist.is_initialized():
        raise RuntimeError("create_engine runs inside a process group: call init_process_group")
    if _unresolved_store(job):
        raise ValueError(
            "storage: a library caller gives the store (storage.path=DIR, or storage.master "
            "and storage.metadata_server of a running Mooncake master)"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    gpus = torch.cuda.device_count()
    local = local_rank if local_rank is not None else rank % gpus if gpus else 0
    return open_engine(job.recipe(), rank, world, local, device_kv=device_kv)


def _unresolved_store(job: Job) -> bool:
    storage = job.storage
    if storage.kind is StorageKind.file:
        return storage.path is None
    return storage.kind is StorageKind.mooncake and storage.master == "auto"
