"""Compositions kept for the length of a process.

Hydra takes a fifth of a second to compose the tree, and one process composes the same
overrides again and again: a fallback's sibling for every session that reads it, `validate`'s
options, a sweep's jobs, a test suite's grids. A composition is a function of its overrides and
of the options in the ConfigStore (the shipped files, read through `pkg://pipeline.conf`, never
change under a running process; a user's folder is registered there, so its options are part
of the key, text and all). It is kept pickled, so each caller gets a copy of its own to change.
"""

from __future__ import annotations

import functools
import pickle

from hydra import compose
from hydra.core.config_store import ConfigNode, ConfigStore
from omegaconf import DictConfig, OmegaConf

KEPT = 512
"""Compositions kept (about 30 KB each): more than one `validate` or grid composes."""


def composition(overrides: list[str], *, hydra_node: bool) -> DictConfig:
    """`config` with `overrides` (Hydra's compose, or a copy of the same composition earlier
    in this process); Hydra's own errors propagate and nothing is kept of them."""
    kept = _composed(tuple(overrides), hydra_node, registered_options())
    return pickle.loads(kept)


@functools.lru_cache(maxsize=KEPT)
def _composed(overrides: tuple[str, ...], hydra_node: bool, _options: tuple) -> bytes:
    cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_node)
    return pickle.dumps(cfg)


def registered_options() -> tuple[tuple[str, str], ...]:
    """(group/name, YAML) of every option a folder registered in the ConfigStore (entries with
    a provider, Hydra's own left out): what a composition reads besides the shipped files."""
    found = []
    for group, entries in ConfigStore.instance().repo.items():
        if group == "hydra" or not isinstance(entries, dict):
            continue
        for name, node in entries.items():
            if isinstance(node, ConfigNode) and node.provider is not None:
                found.append((f"{group}/{name}", f"{node.package}\n{OmegaConf.to_yaml(node.node)}"))
    return tuple(sorted(found))
