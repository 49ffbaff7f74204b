"""vLLM's worker connectors on rank processes (one per TP rank, on gloo), stepped by a
scheduler in the test's process as vLLM's executor steps its workers: each step goes to every
rank by queue, each rank's `ModelRunnerOutput` comes back (`on_ranks`). Commands between
steps: "forget" (zero the KV cache: vLLM's own cache forgot it too), "fresh" (a new
connector and KV cache: the host tier empty). Spawned ranks import it by name."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import vllmfns
import vllmsteps
from vllm.config import set_current_vllm_config
from vllm.distributed import parallel_state

Spec = tuple[Path, dict[str, Any], int]
"""(model folder, kv_connector_extra_config, TP size): every process builds the same config."""


def config_of(spec: Spec) -> Any:
    model_dir, extra, tp = spec
    return vllmfns.vllm_config(
        model_dir,
        connector="PipelineConnector",
        module_path="pipeline.integrations.vllm",
        extra=extra,
        tensor_parallel_size=tp,
    )


def fresh_worker(spec: Spec) -> tuple[Any, dict[str, torch.Tensor]]:
    config = config_of(spec)
    return vllmfns.make_worker(config, vllmfns.kv_cache_config_of(config))


def stepped(args: tuple, rank: int, world_size: int, local_rank: int) -> list[dict]:
    """Carry out the scheduler's steps and commands until None; per phase (between
    commands), the KV each layer's first wait returned (vLLM's block layout, as int16
    arrays: a tensor's storage would be shared with a process that is gone)."""
    spec, inboxes, outbox = args
    phases: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}

    def first_wait(index: int, name: str, kv: torch.Tensor) -> None:
        if name not in seen:
            seen[name] = kv.view(torch.int16).numpy().copy()

    with_vllm_groups(config_of(spec), rank, world_size)
    worker, caches = fresh_worker(spec)
    runtime = worker.worker_side.engine.runtime  # on vLLM's TP group and its gloo twin
    assert not runtime.cpu_group.made and runtime.global_ranks == (0, 1)
    try:
        while (command := inboxes[rank].get()) is not None:
            if command in ("forget", "fresh"):
                phases.append(seen)
                seen = {}
                if command == "fresh":
                    worker.shutdown()
                    worker, caches = fresh_worker(spec)
                for kv in caches.values():
                    kv.zero_()
                continue
            output = vllmsteps.worker_step(rank, worker, caches, command, first_wait)
            outbox.put((rank, output))
        phases.append(seen)
    finally:
        worker.shutdown()
    return phases


def with_vllm_groups(config: Any, rank: int, world_size: int) -> None:
    """vLLM's own world and TP group over this rank's process group (gloo), as its worker
    makes them: the connector's engine runs on vLLM's TP group and its gloo twin."""
    with set_current_vllm_config(config):
        parallel_state.init_distributed_environment(
            world_size, rank, local_rank=rank, backend="gloo"
        )
        parallel_state.initialize_model_parallel(world_size, backend="gloo")


def on_ranks(inboxes: list[Any], outbox: Any, running: Callable[[], bool]) -> vllmsteps.StepWorkers:
    """A step sent to every rank; their outputs in rank order (AssertionError once the
    ranks stopped running without answering: their failure is `launch`'s to say)."""

    def answer() -> tuple[int, Any]:
        while True:
            try:
                return outbox.get(timeout=1)
            except queue.Empty:
                if not running():
                    raise AssertionError("the ranks stopped without answering") from None

    def step(planned: vllmsteps.Step) -> list[Any]:
        for inbox in inboxes:
            inbox.put(planned)
        said = dict(answer() for _ in inboxes)
        return [said[rank] for rank in range(len(inboxes))]

    return step


def as_kv(phase: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A phase's KV as `stepped` returned it, as bf16 tensors again."""
    return {name: torch.from_numpy(rows).view(torch.bfloat16) for name, rows in phase.items()}
