"""Composing one invocation's config, deciding its strategy, and typing it into a `Job`.

`Session` wraps a composed config with a way to compose its siblings (a fallback strategy with
the same overrides); it needs an initialized Hydra (`initialize_config_module`) when it
composes. Every mistake surfaces as a `ConfigError` before a `Job` exists, so no rank ever
starts on a config that cannot run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hydra import compose
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.assemble import assemble, stage_problems
from pipeline.config.eligibility import Verdict, decide, normalize
from pipeline.config.job import Job, job_problems
from pipeline.config.schema import GROUP_SCHEMAS, Config
from pipeline.config.schema_check import not_a_field
from pipeline.spec.checks import ConfigError, Problem, raise_problems
from pipeline.spec.model import ModelGeometry
from pipeline.spec.topology import Topology

GROUP_CHOICE_PREFIXES = ("strategy=", "+strategy=", "++strategy=")
DIRECTIONS = ("backup", "load", "l3")


def register_schemas() -> None:
    """Store `base_config` and one `base_<group>` per group (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)


def message_of(e: BaseException) -> str:
    """An exception and its causes on one line (Hydra wraps the useful part)."""
    parts: list[str] = []
    cause: BaseException | None = e
    while cause is not None:
        text = " ".join(str(cause).split())
        if text and text not in parts:
            parts.append(text)
        cause = cause.__cause__
    return ": ".join(parts)


def composed(overrides: list[str], *, hydra_node: bool = False) -> DictConfig:
    """`config` with overrides; a composition error becomes a ConfigError."""
    try:
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_node)
    except ConfigError:
        raise
    except Exception as e:  # Hydra's composition errors: missing options, bad values
        raise ConfigError([Problem("", message_of(e), "overrides")]) from None


def typed(node: DictConfig, key: str) -> Any:
    """The schema object of a composed node; any mistake becomes a ConfigError (the range
    checks' own, or OmegaConf's: a missing required field)."""
    try:
        return OmegaConf.to_object(node)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError([Problem(key, f"{key}: {message_of(e)}")]) from None


def typed_groups(cfg: DictConfig) -> dict[str, Any]:
    """Every group's schema object (ConfigError with the problems of every group at once)."""
    groups, found = {}, []
    for group in GROUP_SCHEMAS:
        try:
            groups[group] = typed(cfg[group], group)
        except ConfigError as e:
            found += e.problems
    raise_problems(found)
    return groups


@dataclass(frozen=True)
class Session:
    """One invocation: its composed config, the overrides that made it, its strategy option."""

    cfg: DictConfig
    overrides: tuple[str, ...]
    choices: Mapping[str, str]
    """The option chosen for each config group."""

    @classmethod
    def compose(cls, overrides: list[str]) -> Session:
        """Compose `config` with overrides (Hydra must be initialized)."""
        cfg = composed(overrides, hydra_node=True)
        choices = {g: str(cfg.hydra.runtime.choices[g]) for g in GROUP_SCHEMAS}
        with open_dict(cfg):
            del cfg["hydra"]
        return cls(cfg, tuple(overrides), MappingProxyType(choices))

    @property
    def strategy_option(self) -> str:
        return self.choices["strategy"]

    def as_yaml(self) -> str:
        """The config that runs, as YAML (`--cfg job`): the effective strategy's where the
        requested one falls back, with a comment saying so."""
        verdict = self.verdict()
        if verdict.active:
            return OmegaConf.to_yaml(self.cfg)
        said = (
            f"# strategy {verdict.strategy} is inactive here: {verdict.effective_strategy} runs\n"
        )
        return said + OmegaConf.to_yaml(self.with_strategy(verdict.effective_strategy))

    def with_strategy(self, option: str) -> DictConfig:
        """The same config with another strategy option (keeping strategy.* knob overrides)."""
        kept = [o for o in self.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
        return composed([*kept, f"strategy={option}"])

    def model(self) -> ModelGeometry:
        return typed(self.cfg.model, "model")

    def topology(self) -> Topology:
        """The topology as given (normalizations are applied by `verdict` and `job`)."""
        return typed(self.cfg.topology, "topology")

    def verdict(self) -> Verdict:
        """Is the requested strategy active, and what runs instead (ConfigError first for keys
        that no schema declares)."""
        raise_problems(unknown_keys(self.cfg))

        def lookup(option: str) -> tuple[list[str], str | None]:
            node = (
                self.cfg.strategy
                if option == self.strategy_option
                else self.with_strategy(option).strategy
            )
            return list(node.requires), node.fallback

        storage = typed(self.cfg.storage, "storage")
        return decide(self.strategy_option, self.topology(), self.model(), storage, lookup)

    def job(self) -> Job:
        """What runs, typed once and checked whole: the effective strategy's stages on the
        normalized topology (ConfigError listing every problem otherwise)."""
        verdict = self.verdict()
        cfg = self.cfg if verdict.active else self.with_strategy(verdict.effective_strategy)
        raise_problems(strategy_stage_problems(cfg))
        groups = typed_groups(cfg)
        topology, _ = normalize(groups["topology"])
        job = Job(
            model=groups["model"],
            topology=topology,
            strategy=assemble(groups["strategy"]),
            workload=groups["workload"],
            runtime=groups["runtime"],
            bench=groups["bench"],
            simulate=groups["simulate"],
            soak=groups["soak"],
            storage=groups["storage"],
            verdict=verdict,
            strict=bool(cfg.strict),
        )
        raise_problems(job_problems(job))
        return job


def strategy_stage_problems(cfg: DictConfig) -> list[Problem]:
    """Every problem of the stage lists of the config's strategy."""
    plain: Any = {d: OmegaConf.to_container(cfg.strategy[d], resolve=True) for d in DIRECTIONS}
    return stage_problems(plain, OmegaConf.select(cfg, "strategy.ownership", default=None))


def unknown_keys(node: DictConfig, path: str = "") -> list[Problem]:
    """Keys that a typed node's schema does not declare (`+key=` can sneak them in)."""
    schema = OmegaConf.get_type(node)
    if schema is None or not dataclasses.is_dataclass(schema):
        return []
    declared = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key in map(str, node):
        full = f"{path}.{key}" if path else key
        if key not in declared:
            found.append(not_a_field(full, schema))
        elif isinstance(node._get_node(key), DictConfig):
            found += unknown_keys(node[key], full)
    return found
