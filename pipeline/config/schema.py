"""Typed schemas of the config groups that only jobs read, and the root `Config`.

The model, topology and strategy schemas are the core layer's own dataclasses. Every YAML
option starts with `defaults: [base_<group>]`, so composing it checks types, enum choices and
unknown keys against these; required fields have no default. Range checks run in
`__post_init__`, so `validate` reports them with file and key. Each field's one-line doc is the
string literal under it (`tests/unit/test_schema.py` insists). This module imports no Hydra.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.drive_schemas import BenchConfig, Placement, SimulateConfig, SoakConfig
from pipeline.core.checks import (
    LARGEST_NUMBER,
    Problem,
    at_least,
    finite,
    raise_problems,
)
from pipeline.core.events import EventsConfig
from pipeline.core.model import ModelGeometry
from pipeline.core.sizing import parse_bytes
from pipeline.core.storage import StorageConfig
from pipeline.core.strategy import StrategyConfig
from pipeline.core.topology import Backend, Topology

MAX_TOKENS = 1 << 24
"""The most tokens a workload moves or a device pool holds: 16M tokens of deepseek_v3 are
1.2 TB, beyond any one engine; `plan` of 64M tokens took 95 s and 7 GB of memory."""


@dataclass(kw_only=True)
class WorkloadConfig:
    """What `run` and `plan` move."""

    num_tokens: int
    """Tokens moved per backup and per load-back."""
    placement: Placement = Placement.contiguous
    """contiguous: first free pages; fragmented: random page ids on both sides."""
    cycles: int = 1
    """Rounds of backup -> evict -> load-back."""
    seed: int = 0
    """Seed of the pool contents and of fragmented placement."""
    device_tokens: int
    """Device KV pool size in tokens (logical slots)."""
    host_ratio: float | None = None
    """Host budget = host_ratio x the device pool's bytes (a serving engine's hicache ratio);
    null: 2.0, unless host_bytes gives the budget."""
    host_bytes: str | None = None
    """Host budget of each rank in bytes, instead of host_ratio: an int or a size such as
    64GiB (KiB, MiB...: powers of 1024; KB, MB...: of 1000); null: host_ratio sizes it."""

    def __post_init__(self) -> None:
        found = at_least("workload", self, num_tokens=1, cycles=1, device_tokens=1)
        found += finite("workload", self, "host_ratio")
        for name in ("num_tokens", "device_tokens"):
            value = getattr(self, name)
            if isinstance(value, int) and MAX_TOKENS < value <= LARGEST_NUMBER:
                message = f"workload.{name}={value}: at most {MAX_TOKENS} tokens (2**24)"
                found.append(Problem(f"workload.{name}", message))
        if isinstance(self.host_ratio, int | float) and not found and self.host_ratio <= 0:
            found.append(
                Problem("workload.host_ratio", f"workload.host_ratio={self.host_ratio} must be > 0")
            )
        found += self._host_bytes_problems()
        raise_problems(found)

    def _host_bytes_problems(self) -> list[Problem]:
        key = "workload.host_bytes"
        if self.host_bytes is None:
            return []
        if self.host_ratio is not None:
            message = (
                f"{key} and workload.host_ratio are both set: give one (the host budget in "
                "bytes, or as a ratio of the device pool)"
            )
            return [Problem(key, message)]
        try:
            parse_bytes(str(self.host_bytes))
        except ValueError:
            message = (
                f"{key}={self.host_bytes!r} must be a whole number of bytes from 1 to 1e15, "
                "e.g. 64GiB, 512MiB or 68719476736"
            )
            return [Problem(key, message)]
        return []

    @property
    def host_budget_bytes(self) -> int | None:
        """host_bytes in bytes (None: the budget is a ratio)."""
        return None if self.host_bytes is None else parse_bytes(str(self.host_bytes))

    @property
    def host_key(self) -> str:
        """The key that sizes the host pool: the one a message asks to raise."""
        return "workload.host_ratio" if self.host_bytes is None else "workload.host_bytes"


@dataclass(kw_only=True)
class RuntimeConfig:
    """Process groups and timeouts."""

    backend: Backend = Backend.auto
    """Process-group backend: auto picks nccl on cuda, gloo on cpu."""
    timeout_s: float = 120.0
    """Collective and rank-join timeout."""
    trace_file: str | None = None
    """Write the op trace of every rank here as JSON lines; null writes none."""
    debug_consensus: bool = False
    """All-gather the inputs of every rank-replicated decision and raise on divergence."""
    metrics_port: int | None = None
    """Serve Prometheus metrics at http://metrics_address:port/metrics while a job runs (each
    rank on port + its global rank, so port + tp_size - 1 <= 65535 where the engine holds the
    whole world); null serves none."""
    metrics_address: str = "127.0.0.1"
    """The address the metrics listener binds: loopback unless you open it on purpose (a
    config file may name only a loopback address; any other comes from the command line)."""
    links: str = "h200"
    """The link speeds the cost model reads (explain's estimates, strategy=auto): a preset of
    conf/links (h200, cpu) or the path of a file `bench bench=links` wrote (from a config
    file: a path inside its config folder, relative to it)."""

    def __post_init__(self) -> None:
        found = finite("runtime", self, "timeout_s")
        port = self.metrics_port
        if isinstance(port, int) and not isinstance(port, bool) and not 1 <= port <= 65535:
            key = "runtime.metrics_port"
            found.append(Problem(key, f"{key}={port} must lie in [1, 65535] (or null: none)"))
        if isinstance(self.metrics_address, str) and not self.metrics_address.strip():
            key = "runtime.metrics_address"
            found.append(Problem(key, f"{key} must name an address, e.g. 127.0.0.1"))
        if isinstance(self.links, str) and not self.links.strip():
            key = "runtime.links"
            found.append(Problem(key, f"{key} must name a preset (h200, cpu) or a links file"))
        if isinstance(self.timeout_s, int | float) and not found and self.timeout_s <= 0:
            key = "runtime.timeout_s"
            found.append(Problem(key, f"{key}={self.timeout_s} must be > 0"))
        raise_problems(found)


@dataclass(kw_only=True)
class Config:
    """The whole config tree of one invocation."""

    model: ModelGeometry
    """The model whose KV cache moves."""
    topology: Topology
    """The deployment's parallel layout and cache backends."""
    strategy: StrategyConfig
    """Who moves which layer, and the stage lists that move it."""
    workload: WorkloadConfig
    """What `run` and `plan` move."""
    runtime: RuntimeConfig
    """Process groups and timeouts."""
    bench: BenchConfig
    """What `bench` measures."""
    simulate: SimulateConfig
    """What `simulate` drives."""
    soak: SoakConfig
    """What `soak` drives."""
    storage: StorageConfig
    """The L3 store behind the host tier."""
    events: EventsConfig
    """Where the engine publishes which pages its host and L3 tiers hold."""
    strict: bool = False
    """Refuse to run (and make explain exit 1) when the requested strategy is inactive."""


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelGeometry,
    "topology": Topology,
    "strategy": StrategyConfig,
    "workload": WorkloadConfig,
    "runtime": RuntimeConfig,
    "bench": BenchConfig,
    "simulate": SimulateConfig,
    "soak": SoakConfig,
    "storage": StorageConfig,
    "events": EventsConfig,
}
