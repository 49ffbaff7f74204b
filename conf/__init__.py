"""The shipped config tree, installed as `pipeline.conf` (pyproject.toml maps it here). Hydra
imports this package to read it (pkg://pipeline.conf), which is when the typed schemas must be
in the ConfigStore: every `base_<group>` the YAML options extend."""

from pipeline.config.compose import register_schemas

register_schemas()
