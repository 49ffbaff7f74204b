"""Composing one invocation's config, deciding its strategy, and typing it into a `Job`.

`Session` wraps a composed config with a way to compose its siblings (a fallback strategy with
the same overrides); it needs an initialized Hydra (inside the app, or `initialize_*` in tests)
only when it composes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hydra import compose
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.config.assemble import assemble
from pipeline.config.eligibility import Verdict, decide, normalize
from pipeline.config.job import Job
from pipeline.config.schema import GROUP_SCHEMAS, Config
from pipeline.spec.model import ModelGeometry
from pipeline.spec.topology import Topology

GROUP_CHOICE_PREFIXES = ("strategy=", "+strategy=", "++strategy=")


def register_schemas() -> None:
    """Store `base_config` and one `base_<group>` per group (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group=group, name=f"base_{group}", node=schema)


@dataclass(frozen=True)
class Session:
    """One invocation: its composed config, the overrides that made it, its strategy option."""

    cfg: DictConfig
    overrides: tuple[str, ...]
    strategy_option: str

    @classmethod
    def compose(cls, overrides: list[str]) -> Session:
        """Compose `config` with overrides (Hydra must be initialized)."""
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        option = cfg.hydra.runtime.choices["strategy"]
        with open_dict(cfg):
            del cfg["hydra"]
        return cls(cfg, tuple(overrides), option)

    def with_strategy(self, option: str) -> DictConfig:
        """The same config with another strategy option (keeping strategy.* knob overrides)."""
        kept = [o for o in self.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
        return compose(config_name="config", overrides=[*kept, f"strategy={option}"])

    def model(self) -> ModelGeometry:
        return OmegaConf.to_object(self.cfg.model)  # type: ignore[return-value]

    def topology(self) -> Topology:
        """The topology as given (normalizations are applied by `verdict` and `job`)."""
        return OmegaConf.to_object(self.cfg.topology)  # type: ignore[return-value]

    def verdict(self) -> Verdict:
        """Is the requested strategy active, and what runs instead (ValueError first for keys
        that no schema declares)."""
        unknown = unknown_keys(self.cfg)
        if unknown:
            raise ValueError("unknown config keys: " + "; ".join(unknown))

        def lookup(option: str) -> tuple[list[str], str | None]:
            node = (
                self.cfg.strategy
                if option == self.strategy_option
                else self.with_strategy(option).strategy
            )
            return list(node.requires), node.fallback

        return decide(self.strategy_option, self.topology(), self.model(), lookup)

    def job(self) -> Job:
        """What runs, typed once: the effective strategy's stages on the normalized topology."""
        verdict = self.verdict()
        cfg = self.cfg if verdict.active else self.with_strategy(verdict.effective_strategy)
        typed: Config = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        topology, _ = normalize(typed.topology)
        return Job(
            model=typed.model,
            topology=topology,
            strategy=assemble(typed.strategy),
            workload=typed.workload,
            runtime=typed.runtime,
            bench=typed.bench,
            simulate=typed.simulate,
            verdict=verdict,
            strict=typed.strict,
        )


def unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Keys that a typed node's schema does not declare (`+key=` can sneak them in)."""
    schema = OmegaConf.get_type(node)
    if schema is None or not dataclasses.is_dataclass(schema):
        return []
    declared = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key in map(str, node):
        full = f"{path}.{key}" if path else key
        if key not in declared:
            found.append(f"{full}: not a field of {schema.__name__} (known: {sorted(declared)})")
        elif isinstance(node._get_node(key), DictConfig):
            found += unknown_keys(node[key], full)
    return found
