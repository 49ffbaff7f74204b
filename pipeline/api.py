"""Use from a serving engine: one rank's transfer engine inside the caller's own processes.

The caller starts its ranks (torchrun, or its own launcher) and the default process group.
An engine serves the ranks that hold the same KV, its TP ranks: the caller's attention-TP
group (`group=`, TP rank r is the group's rank r), so a world may hold several engines (DP
replicas, pipeline stages); or, without `group`, the whole default group. On each rank:

    job = pipeline.compose(["model=deepseek_v3", "topology=tp2", "strategy=rotating"])
    engine = pipeline.create_engine(job, group=tp_group, device_kv=kv)  # kv: your KV, or None

`compose` runs the checks the command line runs (every problem at once, before a byte
moves); `create_engine` makes this rank's groups (with `group`'s ranks only), streams and
pools. Index tensors of
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
from pipeline.core.l3 import namespace
from pipeline.core.l3_keys import BlockHash, PageKey, block_keys
from pipeline.core.storage import StorageKind
from pipeline.engine.adopt import Adopted
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.engine.l3.store_view import StoreView, open_view


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
    group: dist.ProcessGroup | None = None,
    cpu_group: dist.ProcessGroup | None = None,
    device_kv: Adopted | None = None,
    local_rank: int | None = None,
) -> Engine:
    """This rank's engine, a collective over `group`'s ranks only (init_process_group first).
    `group`: the process group of the ranks that hold the same KV (SGLang's attn_tp_group,
    vLLM's get_tp_group()), of topology.tp_size ranks in increasing order; this rank's TP
    rank is its rank there. None: the default group, then of exactly tp_size ranks.
    `cpu_group`: your gloo group over the same ranks, for the engine's host-side agreement
    (its timeout, not runtime.timeout_s, then bounds `poll`); None: the engine makes its
    own. The groups the engine makes are made by `group`'s ranks alone, so other engines in
    the world need not take part.
    `device_kv`: the caller's device KV tensors, adopted instead of allocating
    (the job's `workload.device_tokens` is then taken from them): one per ("kv" or "index",
    layer), each [pages, page_size, row elements] of the KV dtype (index: uint8; vLLM's
    [blocks, block_size, dim] where a block is a page) or SGLang's [tokens, 1, dim]; or one
    stacked [layers, pages, page_size, dim] per pool kind ("kv", "index"). See
    `pipeline.engine.adopt`: nothing is copied, and what does not fit is refused saying why.
    `local_rank`: the GPU to use (default: the global rank modulo the GPUs here).
    `engine.close()` destroys only the groups the engine made: `group`, `cpu_group` and the
    default group stay usable."""
    if not dist.is_initialized():
        raise RuntimeError("create_engine runs inside a process group: call init_process_group")
    _check_store_given(job)
    gpus = torch.cuda.device_count()
    local = local_rank if local_rank is not None else dist.get_rank() % gpus if gpus else 0
    return open_engine(job.recipe(), local, group=group, cpu_group=cpu_group, device_kv=device_kv)


def page_keys(
    job: Job,
    hashes: Sequence[BlockHash],
    *,
    parent: BlockHash | None = None,
    token_ids: Sequence[int] | None = None,
) -> list[PageKey]:
    """The page keys of a serving engine's own block hashes, one per page in order, for
    `Engine.write_back`, `lookup`, `load_from_l3`, `prefetch` and `open_store`'s view:
    SGLang's hex strings, vLLM's ints or bytes (pass an older vLLM's `BlockHashType.hash_value`).
    Each hash must already name its whole prefix (both engines chain them); the same hash
    gives the same key in every process, of this job's namespace (`storage.model_revision`,
    `storage.tenant`). Each key remembers its hash, the one before it (`parent`: the hash
    before the first page, if any) and its page of `token_ids` (every page's, in order, if
    given), and the KV events name its page by them (docs/events.md). ValueError naming the
    first hash that is not a non-empty str or bytes, or an int, or token ids not a page
    each."""
    space = namespace(job.model, job.storage.model_revision, job.storage.tenant)
    page_tokens = job.model.page_size * job.topology.dcp_size
    return block_keys(hashes, space, parent=parent, token_ids=token_ids, page_tokens=page_tokens)


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
