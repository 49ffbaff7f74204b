"""`PipelineConnector`: vLLM's `KVConnectorBase_V1` over this project's engine, loaded by vLLM
itself (`"kv_connector": "PipelineConnector", "kv_connector_module_path":
"pipeline.integrations.vllm"`). Its scheduler role answers from the host tier's directory and
the store (`SchedulerSide`); its worker role moves blocks on each TP rank (`WorkerSide`).
This class is the thin shim over vLLM's interface, which moves between releases (tested
with vLLM 0.32.0 and 0.26.0, docs/vllm.md)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from pipeline.integrations.vllm.metadata import StepMeta
from pipeline.integrations.vllm.scheduler_side import SchedulerSide
from pipeline.integrations.vllm.settings import connector_job, hashes_seeded_at_random
from pipeline.integrations.vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("hicache-pipeline")


class PipelineConnector(KVConnectorBase_V1):
    """The job is composed and checked as vLLM builds the connector, before vLLM allocates
    KV (every problem of the overrides at once)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        job = connector_job(vllm_config)
        self.scheduler_side: SchedulerSide | None = None
        self.worker_side: WorkerSide | None = None
        if role is KVConnectorRole.SCHEDULER:
            if job.storage.attached and hashes_seeded_at_random(os.environ):
                log.warning(
                    "vLLM %s seeds its block hashes at random in each process: the store's "
                    "blocks will hit only in this one; set PYTHONHASHSEED (the same for every "
                    "engine) to find them after a restart or from another engine",
                    vllm.__version__,
                )
            self.scheduler_side = SchedulerSide(job, kv_cache_config.num_blocks)
        else:
            self.worker_side = WorkerSide(job)

    # scheduler role

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._scheduler().matched(request, num_computed_tokens), False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._scheduler().allocated(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler().step(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        scheduler = self._scheduler()
        if connector_output.invalid_block_ids:
            scheduler.failed(set(connector_output.invalid_block_ids))
        scheduler.events.returned()  # the workers ended the step's moves before returning

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._scheduler().events.take()

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._scheduler().finished(request)
        return False, None  # its backups ended with the step that filled its blocks

    # worker role

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker().register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker().start(self._step())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_layer(layer_name)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        pass  # whole blocks are backed up at wait_for_save, every layer at once

    def wait_for_save(self) -> None:
        self._worker().save(self._step())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker().load_errors()

    def shutdown(self) -> None:
        if self.worker_side is not None:
            self.worker_side.close()
        if self.scheduler_side is not None:
            self.scheduler_side.close()

    def _step(self) -> StepMeta:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StepMeta)
        return meta

    def _scheduler(self) -> SchedulerSide:
        if self.scheduler_side is None:
            raise RuntimeError("PipelineConnector: a scheduler-role call on a worker")
        return self.scheduler_side

    def _worker(self) -> WorkerSide:
        if self.worker_side is None:
            raise RuntimeError("PipelineConnector: a worker-role call in the scheduler")
        return self.worker_side
