"""Where config options come from: the shipped `pipeline.conf` package, and a user's checked
folder.

User options reach Hydra only through the ConfigStore, after `untrusted.read_config_dir`
checked them; `ConfigSources.registered()` puts them there for the length of a command.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore

from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.config.untrusted import UserOption, read_config_dir, read_yaml
from pipeline.core.checks import Problem

SHIPPED = "pipeline.conf"
"""The package the shipped options are installed as: the repository's `conf/` folder, under
this package's name, so a `conf/` of the user's own (every Hydra project has one) in the
working folder never shadows it (`pkg://pipeline.conf`)."""


def shipped_root() -> Path:
    """The folder of the shipped options (found without importing their package: importing it
    registers the schemas, which imports this layer)."""
    spec = importlib.util.find_spec(SHIPPED)
    assert spec is not None and spec.submodule_search_locations, f"{SHIPPED} ships"
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_options() -> dict[str, set[str]]:
    """Every shipped option per config group."""
    root = shipped_root()
    return {group: {p.stem for p in (root / group).glob("*.yaml")} for group in GROUP_SCHEMAS}


@functools.cache
def _shipped_lines(path: str) -> dict[str, int]:
    return read_yaml(Path(path))[1]


@dataclass(frozen=True)
class ConfigSources:
    """The options a composition may use, and what is wrong with the user's."""

    user: tuple[UserOption, ...] = ()
    problems: tuple[Problem, ...] = ()
    """Every problem of the user folder, with file, key and line."""
    folder: str | None = None
    """The user folder (`--config-dir`), if any."""

    @classmethod
    def load(cls, config_dir: str | None, allowed: Sequence[str] = ()) -> ConfigSources:
        if config_dir is None:
            return cls()
        options, problems = read_config_dir(config_dir, shipped_options(), allowed)
        return cls(tuple(options), tuple(problems), config_dir)

    def options(self) -> list[tuple[str, str, str]]:
        """(group, option, file) of every option: shipped first, then the user's."""
        root = shipped_root()
        shipped = [
            (group, name, str(root / group / f"{name}.yaml"))
            for group, names in shipped_options().items()
            for name in sorted(names)
        ]
        return shipped + self.own_options()

    def own_options(self) -> list[tuple[str, str, str]]:
        """(group, option, file) of the user folder's options."""
        return [(o.group, o.name, o.path) for o in self.user]

    def file_of(self, group: str, option: str) -> tuple[str, dict[str, int]]:
        """(path, key lines) of one option's file."""
        for o in self.user:
            if (o.group, o.name) == (group, option):
                return o.path, o.lines
        path = str(shipped_root() / group / f"{option}.yaml")
        return path, _shipped_lines(path) if Path(path).is_file() else {}

    @contextlib.contextmanager
    def registered(self) -> Iterator[None]:
        """The user's checked options in the ConfigStore, for the length of the block."""
        store = ConfigStore.instance()
        for o in self.user:
            store.store(group=o.group, name=o.name, node=o.data, provider="user config dir")
        try:
            yield
        finally:
            for o in self.user:  # the ConfigStore has no public way to take an entry out
                store.repo[o.group].pop(f"{o.name}.yaml", None)
