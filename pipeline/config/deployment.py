"""A user folder's `config.yaml`: a deployment's defaults, as a Hydra primary config sets them
(a `defaults` list choosing an option per group, then plain knobs), under the command line.

It is read as every file of the folder is (`untrusted`: size-capped, no link followed, no tag,
anchor, alias or directive; each group's section checked as an option file of that group is,
endpoints included). It reaches Hydra through the ConfigStore, as the one option of the
`deployment` group at the global package, and each composition of the command names it
first (`Configs.overrides`): the command line comes after it, so it wins, and its knobs win
over the options both choose (Hydra's `_self_` last).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.config.schema_check import without
from pipeline.config.sources import ConfigSources
from pipeline.config.untrusted import option_problems, read_yaml
from pipeline.core.checks import Problem

FILE = "config.yaml"
GROUP, NAME = "deployment", "config"
SELF = "_self_"
TOP_KEYS = ("defaults", "strict", *GROUP_SCHEMAS)
"""What a deployment's file may hold: the defaults list, `strict`, a section per group."""


@dataclass(frozen=True)
class Deployment:
    """A checked `config.yaml`: the options it chooses and its knobs, as Hydra gets them."""

    path: str
    choices: Mapping[str, str]
    """The option it chooses per group."""
    knobs: dict[str, Any]
    """Its sections (and `strict`), without any key a problem names."""
    lines: dict[str, int]
    """Dotted key -> line in the file."""

    @property
    def node(self) -> dict[str, Any]:
        """The config Hydra composes: its choices as overrides of conf/config.yaml's."""
        chosen = [{f"override /{g}": option} for g, option in self.choices.items()]
        return {"defaults": [*chosen, SELF], **self.knobs}


def read_deployment(
    folder: str | None, options: Mapping[str, Sequence[str]], endpoints: Sequence[str] = ()
) -> tuple[Deployment | None, list[Problem]]:
    """The folder's deployment (None without a config.yaml), and every problem of it, each at
    its file and line (`options`: each group's, shipped and the folder's)."""
    path = Path(folder or "") / FILE
    if folder is None or not (path.exists() or path.is_symlink()):
        return None, []
    data, lines, found = read_yaml(path)  # a link, a FIFO or a refused token: not read
    if data is None:
        return None, found
    found = top_problems(data) + section_problems(data, options, path.parent, endpoints)
    choices, refused = chosen(data.get("defaults", []), options)
    found += refused
    knobs = {k: v for k, v in data.items() if k in TOP_KEYS and k != "defaults"}
    knobs = {k: without(v, found, k) if isinstance(v, dict) else v for k, v in knobs.items()}
    said = {p.key for p in found}
    knobs = {k: v for k, v in knobs.items() if k not in said}
    placed = [p.at(str(path), p.line or lines.get(p.key)) for p in found]
    return Deployment(str(path), choices, knobs, lines), placed


def top_problems(data: dict[str, Any]) -> list[Problem]:
    """Keys a deployment's file may not hold, and a `strict` that is no boolean."""
    allowed = ", ".join(TOP_KEYS)
    found = [
        Problem(str(key), f"{key}: not a key of a deployment's config.yaml ({allowed})")
        for key in data
        if key not in TOP_KEYS
    ]
    if "strict" in data and not isinstance(data["strict"], bool):
        found.append(Problem("strict", "strict must be true or false"))
    return found


def section_problems(
    data: dict[str, Any],
    options: Mapping[str, Sequence[str]],
    root: Path,
    endpoints: Sequence[str],
) -> list[Problem]:
    """Each group's section, checked as an option file of the group (no defaults list of its
    own: the top-level one chooses options)."""
    found = []
    for group in GROUP_SCHEMAS:
        section = data.get(group)
        if section is None:
            continue
        if isinstance(section, dict) and "defaults" in section:
            message = f"{group}.defaults: choose options in the top-level defaults list"
            found.append(Problem(f"{group}.defaults", message))
            section = {k: v for k, v in section.items() if k != "defaults"}
        if not isinstance(section, dict):
            found.append(Problem(group, f"{group}: must be a mapping of {group}.* knobs"))
            continue
        found += option_problems(group, section, set(options.get(group, ())), root, endpoints)
    return found


def chosen(
    defaults: Any, options: Mapping[str, Sequence[str]]
) -> tuple[dict[str, str], list[Problem]]:
    """(group -> option, problems) of a defaults list of `GROUP: OPTION` entries and `_self_`
    (`override GROUP: OPTION` as Hydra writes it is taken too)."""
    entries = defaults if isinstance(defaults, list) else [defaults]
    choices, found = {}, []
    for i, entry in enumerate(entries):
        key = f"defaults[{i}]" if isinstance(defaults, list) else "defaults"
        if entry == SELF:
            continue
        if not (isinstance(entry, dict) and len(entry) == 1):
            found.append(Problem(key, "defaults: each entry is GROUP: OPTION, or _self_"))
            continue
        ((group, option),) = entry.items()
        group = str(group).removeprefix("override ").strip().lstrip("/")
        if group not in GROUP_SCHEMAS:
            groups = ", ".join(GROUP_SCHEMAS)
            found.append(Problem(key, f"defaults: {group} is no config group ({groups})"))
        elif str(option) not in options.get(group, ()):
            known = ", ".join(sorted(options.get(group, ())))
            message = f"defaults: {group}={option} is no option of the {group} group"
            found.append(Problem(key, f"{message} (options: {known})"))
        else:
            choices[group] = str(option)
    return choices, found


@dataclass(frozen=True)
class Configs:
    """What one command may compose: every option (shipped and the user folder's, with every
    problem of the folder) and the folder's deployment, if it has one."""

    sources: ConfigSources
    deployment: Deployment | None = None

    @classmethod
    def load(cls, config_dir: str | None, allowed: Sequence[str] = ()) -> Configs:
        """The folder's options and deployment, checked (Hydra must be initialized)."""
        sources = ConfigSources.load(config_dir, allowed)
        options: dict[str, list[str]] = {}
        for group, name, _ in sources.options():
            options.setdefault(group, []).append(name)
        deployment, problems = read_deployment(config_dir, options, allowed)
        own = str(Path(config_dir or "") / FILE)
        kept = [p for p in sources.problems if p.file != own]  # "no option": it is ours
        return cls(dataclasses.replace(sources, problems=(*kept, *problems)), deployment)

    @property
    def overrides(self) -> list[str]:
        """What puts the deployment under a composition's overrides."""
        return [] if self.deployment is None else [f"+{GROUP}={NAME}"]

    @contextlib.contextmanager
    def registered(self) -> Iterator[None]:
        """The folder's options and deployment in the ConfigStore, for the length of the
        block."""
        store = ConfigStore.instance()
        with self.sources.registered():
            if self.deployment is None:
                yield
                return
            node = self.deployment.node
            store.store(group=GROUP, name=NAME, node=node, package="_global_", provider="user")
            try:
                yield
            finally:
                store.repo[GROUP].pop(f"{NAME}.yaml", None)
