"""The connector on each of vLLM's TP ranks: an engine over vLLM's own KV tensors (adopted,
not copied) and vLLM's TP group, carrying out each step's moves: loads before the forward
reads a layer (`wait_for_layer_load` waits for that layer alone), backups and write-backs
once the forward wrote the step's blocks."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch
import torch.distributed as dist
from vllm.distributed import parallel_state

import pipeline
from pipeline.config.job import Job
from pipeline.core.slots import page_tokens
from pipeline.engine.cuda.streams import Event
from pipeline.engine.engine import Engine
from pipeline.engine.l3.handles import Loading
from pipeline.integrations.vllm.metadata import Moves, StepMeta


def adopted(job: Job, kv_caches: Mapping[str, torch.Tensor]) -> dict[tuple[str, int], torch.Tensor]:
    """vLLM's per-layer MLA caches, in layer order, as the engine adopts them: each
    [blocks, 1, block_size, row] view as [blocks, block_size, row] (no copy)."""
    if len(kv_caches) != job.model.num_layers:
        raise ValueError(
            f"register_kv_caches: {len(kv_caches)} layers, and the job has "
            f"model.num_layers={job.model.num_layers}"
        )
    found = {}
    for layer, (name, kv) in enumerate(kv_caches.items()):
        if kv.dim() == 4 and kv.shape[1] == 1:
            kv = kv.squeeze(1)
        if kv.dim() != 3:
            raise ValueError(f"register_kv_caches: {name} is {tuple(kv.shape)}, not MLA's")
        found["kv", layer] = kv
    return found


class WorkerSide:
    """One TP rank's engine, and the step it carries out."""

    def __init__(self, job: Job) -> None:
        self.job, self.size = job, job.model.page_size
        self.engine: Engine | None = None
        self.layers: dict[str, int] = {}
        self._loads: list[Loading] = []
        self._errors: set[int] = set()
        self._writing: dict[int, Event] = {}
        """Host page -> the write-back reading it (a page is freed only after it)."""

    def register(self, kv_caches: Mapping[str, torch.Tensor]) -> None:
        group = cpu_group = None
        if tp_initialized():  # vLLM's TP group and its gloo twin: the engine makes none
            tp = parallel_state.get_tp_group()
            group, cpu_group = tp.device_group, tp.cpu_group
        tensors = adopted(self.job, kv_caches)
        self.engine = pipeline.create_engine(
            self.job, group=group, cpu_group=cpu_group, device_kv=tensors
        )
        self.layers = {name: layer for layer, name in enumerate(kv_caches)}

    def start(self, meta: StepMeta) -> None:
        """Free what the scheduler evicted, then issue the step's loads."""
        engine = self._engine()
        if meta.frees:
            for page in meta.frees:
                written = self._writing.pop(page, None)
                if written is not None:
                    settle(written)  # the store has its copy (or failed to take it)
            engine.host_allocator.free(meta.frees)
        self._errors.update(meta.missing)
        for moves in meta.host_loads:
            self._loads.append(engine.load(*self._slots(moves)))
        for moves in meta.store_loads:
            self._load_stored(engine, moves)

    def wait_layer(self, name: str) -> None:
        layer = self.layers[name]
        for load in self._loads:
            load.wait(layer)

    def save(self, meta: StepMeta) -> None:
        """Back up the step's full blocks (after the forward wrote them) and wait for those
        copies and the step's loads; write the blocks back to the store on the engine's
        write-back thread (not waited for: a page it reads is freed only after it)."""
        engine = self._engine()
        copies = []
        for moves in meta.backups:
            engine.host_allocator.claim(moves.pages)
            keys = pipeline.page_keys(self.job, moves.hashes)
            host, device = self._slots(moves)
            copies.append(engine.backup(host, device, keys=keys))
            if engine.l3 is not None:
                written = engine.write_back(keys, host)
                self._writing.update(dict.fromkeys(moves.pages, written))
        for copy in copies:
            copy.wait()  # vLLM may reuse the blocks once the step returns
        for load in self._loads:
            load.done().wait()
        self._loads = []
        engine.poll()  # release what every rank has done (a collective: every rank steps)
        self._writing = {page: w for page, w in self._writing.items() if not w.query()}

    def load_errors(self) -> set[int]:
        errors, self._errors = self._errors, set()
        return errors

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def _load_stored(self, engine: Engine, moves: Moves) -> None:
        """Read the blocks' objects into their host pages and load the intact leading ones
        (a collective); the rest are load errors, their pages freed."""
        engine.host_allocator.claim(moves.pages)
        keys = pipeline.page_keys(self.job, moves.hashes)
        host, device = self._slots(moves)
        loaded = engine.load_from_l3(keys, host, device)
        if loaded.handle is not None:
            self._loads.append(loaded.handle)
        if loaded.hits < len(keys):
            self._errors.update(moves.blocks[loaded.hits :])
            engine.host_allocator.free(moves.pages[loaded.hits :])

    def _slots(self, moves: Moves) -> tuple[torch.Tensor, torch.Tensor]:
        return page_tokens(moves.pages, self.size), page_tokens(moves.blocks, self.size)

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("PipelineConnector: register_kv_caches first")
        return self.engine


def settle(event: Event) -> None:
    """Wait for `event`; a failed write-back only leaves the store without the page."""
    with contextlib.suppress(Exception):  # counted by the engine's hicache_l3_* metrics
        event.wait()


def tp_initialized() -> bool:
    """Whether vLLM made its TP group here (its workers do; a caller that steps the
    connector itself may run on the default group)."""
    return parallel_state.model_parallel_is_initialized() and dist.is_initialized()
