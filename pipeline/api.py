"""Use from a serving engine: one rank's transfer engine inside the caller's own processes.

The caller starts its ranks (torchrun, or its own launcher) and the default process group,
whose ranks are the TP ranks of one pipeline stage (rank r is TP rank r). Then, on each rank:

    job = pipeline.compose(["model=deepseek_v3", "topology=tp2", "strategy=rotating"])
    engine = pipeline.create_engine(job, device_kv=kv)  # kv: your KV tensors, or None

`compose` runs the checks the command line runs (every problem at once, before a byte
moves); `create_engine` makes this rank's groups, streams and pools. Index tensors of
`Engine.backup` / `Engine.load` hold token slots (CPU int64, whole pages: page p is slots
p*page_size .. p*page_size+page_size-1), never KV data.

A scheduler (a process with no rank) keys pages and asks the store what the ranks can load:

    keys = pipeline.page_keys(job, block_hashes)  # or view.keys(token_ids)
    with pipeline.open_store(job) as view:
        hit_pages = view.lookup(keys)
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
from pipeline.engine.store_view import StoreView, open_view
from pipeline.spec.l3 import namespace
from pipeline.spec.l3_keys import BlockHash, block_keys
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
    _check_store_given(job)
    rank, world = dist.get_rank(), dist.get_world_size()
    gpus = torch.cuda.device_count()
    local = local_rank if local_rank is not None else rank % gpus if gpus else 0
    return open_engine(job.recipe(), rank, world, local, device_kv=device_kv)


def page_keys(job: Job, hashes: Sequence[BlockHash]) -> list[str]:
    """The page keys of a serving engine's own block hashes, one per page in order, for
    `Engine.write_back`, `lookup`, `load_from_l3`, `prefetch` and `open_store`'s view:
    SGLang's hex strings, vLLM's ints or bytes (pass an older vLLM's `BlockHashType.hash_value`).
    Each hash must already name its whole prefix (both engines chain them); the same hash
    gives the same key in every process, of this job's namespace (`storage.model_revision`,
    `storage.tenant`). ValueError naming the first hash that is not a non-empty str or bytes,
    or an int."""
    return block_keys(hashes, namespace(job.model, job.storage.model_revision, job.storage.tenant))


def open_store(job: Job) -> StoreView:
    """A view of the job's L3 store for a process with no rank (a scheduler): no process
    group, no engine. `view.lookup(keys)` answers what `Engine.lookup` answers on the ranks,
    locally; `view.keys(tokens)` makes `Engine.l3_keys`'s keys; close it (or use `with`)."""
    if not job.storage.attached:
        raise ValueError("storage=none: pick storage=file or mooncake to look up L3 pages")
    _check_store_given(job)
    return open_view(job.model, job.topology, job.storage, timeout_s=job.runtime.timeout_s)


def _check_store_given(job: Job) -> None:
    if _unresolved_store(job):
        raise ValueError(
            "storage: a library caller gives the store (storage.path=DIR, or storage.master "
            "and storage.metadata_server of a running Mooncake master)"
        )


def _unresolved_store(job: Job) -> bool:
    storage = job.storage
    if storage.kind is StorageKind.file:
        return storage.path is None
    return storage.kind is StorageKind.mooncake and storage.master == "auto"
