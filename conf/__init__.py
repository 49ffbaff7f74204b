"""The shipped config tree. Hydra imports this package to read it (pkg://conf), which is when the
typed schemas must be in the ConfigStore: every `base_<group>` the YAML options extend."""

from pipeline.config.compose import register_schemas

register_schemas()
