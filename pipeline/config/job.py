"""The Job: one invocation's config, typed once in the parent and handed to every rank.

Importing this module loads no Hydra: a rank receives a `Job` and never sees a config tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.eligibility import Verdict
from pipeline.config.schema import BenchConfig, RuntimeConfig, SimulateConfig, WorkloadConfig
from pipeline.engine.strategy import Strategy
from pipeline.spec.model import ModelGeometry
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
    verdict: Verdict
    """Why the effective strategy is the one that runs."""
    strict: bool
    """Refuse an inactive strategy instead of falling back."""
