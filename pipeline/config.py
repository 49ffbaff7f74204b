"""The composed config of one invocation, its typed objects, and the strategy verdict.

`Session` wraps a composed config with a way to compose its siblings (a fallback strategy with
the same overrides); it needs an initialized Hydra (inside `hydra.main`, or `initialize_*` in
tests) only when it composes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hydra import compose
from omegaconf import DictConfig, OmegaConf, open_dict

from pipeline.eligibility import Verdict, decide, normalize
from pipeline.schema import Config
from pipeline.topology import ModelGeometry, Topology

GROUP_CHOICE_PREFIXES = ("strategy=", "+strategy=", "++strategy=")


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

    def __post_init__(self) -> None:
        unknown = unknown_keys(self.cfg)
        if unknown:
            raise ValueError("unknown config keys: " + "; ".join(unknown))

    def with_strategy(self, option: str) -> DictConfig:
        """The same config with another strategy option (keeping strategy.* knob overrides)."""
        kept = [o for o in self.overrides if not o.startswith(GROUP_CHOICE_PREFIXES)]
        return compose(config_name="config", overrides=[*kept, f"strategy={option}"])

    def model(self) -> ModelGeometry:
        return OmegaConf.to_object(self.cfg.model)  # type: ignore[return-value]

    def topology(self) -> Topology:
        """The topology as given (normalizations are applied by `verdict`/`effective`)."""
        return OmegaConf.to_object(self.cfg.topology)  # type: ignore[return-value]

    def verdict(self) -> Verdict:
        def lookup(option: str) -> tuple[list[str], str | None]:
            node = (
                self.cfg.strategy
                if option == self.strategy_option
                else self.with_strategy(option).strategy
            )
            return list(node.requires), node.fallback

        return decide(self.strategy_option, self.topology(), self.model(), lookup)

    def effective(self) -> tuple[dict, Verdict]:
        """The config that runs, as plain data: the effective strategy, normalized topology."""
        verdict = self.verdict()
        cfg = self.cfg if verdict.active else self.with_strategy(verdict.effective_strategy)
        plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        assert isinstance(plain, dict)
        normalized, _ = normalize(self.topology())
        plain["topology"] = OmegaConf.to_container(
            OmegaConf.structured(normalized), enum_to_str=True
        )
        return plain, verdict


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


def typed(plain: dict) -> DictConfig:
    """Plain config data (e.g. sent to a rank process) back onto the typed schema."""
    return OmegaConf.merge(OmegaConf.structured(Config), plain)  # type: ignore[return-value]
