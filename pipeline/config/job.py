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
from pipeline.core.checks import Problem
from pipeline.core.events import EventsConfig, port_problems
from pipeline.core.l3 import object_bytes
from pipeline.core.model import ModelGeometry
from pipeline.core.ownership import Ownership
from pipeline.core.sizing import (
    DEFAULT_HOST_RATIO,
    PoolBudget,
    capacity_problems,
    exchange_staging_bytes,
    size_rank,
)
from pipeline.core.storage import StorageConfig
from pipeline.core.topology import Topology
from pipeline.engine.events import engine_publishers
from pipeline.engine.factory import EngineRecipe
from pipeline.engine.strategy import Strategy


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
    events: EventsConfig
    verdict: Verdict
    """Why the effective strategy is the one that runs."""
    strict: bool
    """Refuse an inactive strategy instead of falling back."""

    def budget(self) -> PoolBudget:
        """The pools' budget: workload.device_tokens, and the host budget in bytes
        (workload.host_bytes) or as a ratio (workload.host_ratio, 2.0 unset)."""
        workload = self.workload
        ratio = DEFAULT_HOST_RATIO if workload.host_ratio is None else workload.host_ratio
        return PoolBudget(workload.device_tokens, ratio, workload.host_budget_bytes)

    def recipe(self) -> EngineRecipe:
        """What each rank's engine is made of (`engine.factory.open_engine` makes it)."""
        return EngineRecipe(
            strategy=self.strategy,
            model=self.model,
            topology=self.topology,
            storage=self.storage,
            events=self.events,
            budget=self.budget(),
            backend=self.runtime.backend,
            timeout_s=self.runtime.timeout_s,
            debug_consensus=self.runtime.debug_consensus,
            metrics_port=self.runtime.metrics_port,
            metrics_address=self.runtime.metrics_address,
        )


def job_problems(job: Job) -> list[Problem]:
    """The rules that join groups, which a rank would otherwise find only after it started:
    workload and bench sizes in whole pages that fit the pools, and staging for a page."""
    aligned = alignment_problems(job.model, job.topology, job.workload, job.bench)
    return (aligned or pool_problems(job)) + event_port_problems(job)


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


def pool_problems(job: Job) -> list[Problem]:
    """Pools that hold what moves, and staging for a page (they read every group)."""
    model, workload, config = job.model, job.workload, job.strategy.config
    sizing = size_rank(model, job.topology, config, 0, job.budget())
    found = capacity_problems(
        sizing,
        num_tokens=workload.num_tokens,
        device_tokens=workload.device_tokens,
        host_key=workload.host_key,
    )
    try:
        exchange_staging_bytes(config, model, sizing.owners)
    except ValueError as e:
        found.append(Problem("strategy.staging_bytes", str(e)))
    # a write-back of the workload's prefix must fit whole, or it would evict its own head
    pages, tokens = -(-workload.num_tokens // sizing.slots_per_page), workload.num_tokens
    one_object = object_bytes(model, job.storage.tenant)
    if problem := job.storage.capacity_problem(one_object, pages, tokens):
        found.append(Problem("storage.capacity_bytes", problem))
    if problem := job.storage.quota_problem(one_object, pages, tokens):
        found.append(Problem("storage.tenant_quota_bytes", problem))
    return found


def event_port_problems(job: Job) -> list[Problem]:
    """The ports the event publishers of engines 0 to `events.dp_rank` (null: 0) bind,
    against each other and the ranks' metrics ports."""
    replicated = job.strategy.config.ownership is Ownership.replicated
    publishers = engine_publishers(job.topology, job.model, per_rank=replicated)
    engine = job.events.dp_rank or 0
    port, ranks = job.runtime.metrics_port, job.topology.tp_size
    metrics = None if port is None else range(port, port + ranks)
    return port_problems(job.events, publishers, range(engine + 1), metrics)
