"""The Job: one invocation's config, typed once in the parent and handed to every rank.

Importing this module loads no Hydra: a rank receives a `Job` and never sees a config tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.eligibility import Verdict
from pipeline.config.schema import (
    BenchConfig,
    RuntimeConfig,
    SimulateConfig,
    SoakConfig,
    WorkloadConfig,
)
from pipeline.engine.strategy import Strategy
from pipeline.spec.checks import Problem
from pipeline.spec.model import ModelGeometry
from pipeline.spec.ownership import owner_map
from pipeline.spec.sizing import (
    DEFAULT_HOST_RATIO,
    exchange_staging_bytes,
    ratio_for_bytes,
    size_pools,
)
from pipeline.spec.storage import StorageConfig
from pipeline.spec.topology import Topology


@dataclass(frozen=True)
class Job:
    """What runs: the effective strategy with its stages, on the normalized topology."""

    model: ModelGeometry
    topology: Topology
    """Normalized: the layout and io backend that run (see `eligibility.normalize`)."""
    strategy: Strategy
    """The effective strategy: the requested one, or its fallback when it is inactive."""
    workload: WorkloadConfig
    runtime: RuntimeConfig
    bench: BenchConfig
    simulate: SimulateConfig
    soak: SoakConfig
    storage: StorageConfig
    verdict: Verdict
    """Why the effective strategy is the one that runs."""
    strict: bool
    """Refuse an inactive strategy instead of falling back."""

    def host_ratio(self, device_tokens: int | None = None) -> float:
        """The host budget as the ratio the engine sizes by: workload.host_ratio (2.0 unset),
        or workload.host_bytes over a device pool of `device_tokens` (default
        workload.device_tokens): the same bytes whatever the pool."""
        workload, model = self.workload, self.model
        host_bytes = workload.host_budget_bytes
        if host_bytes is None:
            return DEFAULT_HOST_RATIO if workload.host_ratio is None else workload.host_ratio
        tokens = workload.device_tokens if device_tokens is None else device_tokens
        pages = tokens // (model.page_size * self.topology.dcp_size)
        return ratio_for_bytes(host_bytes, pages * sum(u.page_bytes for u in model.units))


def job_problems(job: Job) -> list[Problem]:
    """The rules that join groups, which a rank would otherwise find only after it started:
    workload and bench sizes in whole pages that fit the pools, and staging for a page."""
    aligned = alignment_problems(job.model, job.topology, job.workload, job.bench)
    return aligned or capacity_problems(job)


def alignment_problems(
    model: ModelGeometry, topology: Topology, workload: WorkloadConfig, bench: BenchConfig
) -> list[Problem]:
    """Transfer and pool sizes in whole pages (they read only the page size and dcp)."""
    slots = model.page_size * topology.dcp_size
    aligned = f"a multiple of page_size x dcp_size = {slots}"
    found = [
        Problem(key, f"{key}={tokens} must be {aligned}")
        for key, tokens in (
            ("workload.num_tokens", workload.num_tokens),
            ("workload.device_tokens", workload.device_tokens),
        )
        if tokens % slots
    ]
    misaligned = [size for size in bench.sizes if size % slots]
    if misaligned:
        found.append(Problem("bench.sizes", f"bench.sizes {misaligned} must each be {aligned}"))
    return found


def capacity_problems(job: Job) -> list[Problem]:
    """Pools that hold what moves, and staging for a page (they read every group)."""
    model, topology, workload = job.model, job.topology, job.workload
    config = job.strategy.config
    owners = owner_map(config.ownership, topology.replica_group(0, model), model.units)
    sizing = size_pools(
        model,
        topology,
        owners,
        0,
        device_tokens=workload.device_tokens,
        host_ratio=job.host_ratio(),
        keep_capacity=config.keep_capacity,
    )
    found = []
    pages = workload.num_tokens // sizing.slots_per_page
    if 2 * pages > sizing.device_pages:
        found.append(
            Problem(
                "workload.device_tokens",
                f"workload.device_tokens={workload.device_tokens} must hold twice "
                f"workload.num_tokens={workload.num_tokens} (backup source + load target)",
            )
        )
    if pages > sizing.host.num_pages:
        found.append(
            Problem(
                workload.host_key,
                f"the host pool holds {sizing.host_slots} tokens < workload.num_tokens="
                f"{workload.num_tokens}; raise {workload.host_key}",
            )
        )
    try:
        exchange_staging_bytes(config, model, owners)
    except ValueError as e:
        found.append(Problem("strategy.staging_bytes", str(e)))
    return found
