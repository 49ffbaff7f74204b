"""`runtime.links`: a shipped preset (conf/links/<name>.yaml) or a links file that
`bench bench=links` wrote, read as untrusted input (size-capped, no link followed, no tag,
anchor or alias, schema-checked), every problem naming `runtime.links` and the file. No
problem quotes a value of the file: it may be anyone's (a config file may name one only
inside its own folder, see `untrusted`, but the command line names any)."""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path

from pipeline.config.reach import PRESET
from pipeline.config.schema_check import schema_problems
from pipeline.config.sources import shipped_root
from pipeline.config.untrusted import read_yaml
from pipeline.core.checks import ConfigError, Problem
from pipeline.core.cost import Links, link_range

KEY = "runtime.links"


def presets() -> list[str]:
    """The shipped presets' names."""
    return sorted(p.stem for p in (shipped_root() / "links").glob("*.yaml"))


def links_path(value: str) -> Path:
    """The file `runtime.links` names (a preset's, where it is a bare name)."""
    return shipped_root() / "links" / f"{value}.yaml" if PRESET.fullmatch(value) else Path(value)


def expected(key: str) -> str:
    """What a field of a links file must hold (its value is never quoted)."""
    name = key.removeprefix(f"{KEY}.")
    if name == "machine":
        return f"{key}: must be a text (what the figures describe)"
    low, high, unit = link_range(name)
    return f"{key}: must be a number from {low} to {high} ({unit})"


def unquoted(problem: Problem) -> Problem:
    """A problem of a links file's field in words that quote none of its values."""
    known = {f"{KEY}.{f.name}" for f in fields(Links)}
    return Problem(problem.key, expected(problem.key)) if problem.key in known else problem


def links_of(value: str) -> Links:
    """The Links that `runtime.links=value` names (ConfigError naming the key and the file)."""
    if PRESET.fullmatch(value) and value not in presets():
        message = f"{KEY}={value!r} is no preset ({', '.join(presets())}) and no file path"
        raise ConfigError([Problem(KEY, message)])
    return preset_links(value) if PRESET.fullmatch(value) else file_links(Path(value))


@functools.cache
def preset_links(name: str) -> Links:
    """A shipped preset's Links, read once (every composed config checks its links)."""
    return file_links(links_path(name))


def file_links(path: Path) -> Links:
    """The Links of a links file, read as untrusted input."""
    data, lines, problems = read_yaml(path)
    if data is None:
        raise ConfigError(
            [Problem(KEY, f"{KEY}: {p.message}").at(str(path), p.line) for p in problems]
        )
    found = [unquoted(p) for p in schema_problems(data, Links, KEY)]
    missing = [f.name for f in fields(Links) if f.name not in data]
    if missing:
        found.append(Problem(KEY, f"{KEY}: {path} lacks {', '.join(missing)}"))
    if found:
        raise ConfigError(
            [p.at(str(path), lines.get(p.key.removeprefix(f"{KEY}."))) for p in found]
        )
    try:
        return Links(**data)
    except ConfigError as e:
        keyed = [unquoted(Problem(f"{KEY}.{p.key}", "")) for p in e.problems]
        raise ConfigError(
            [p.at(str(path), lines.get(p.key.removeprefix(f"{KEY}."))) for p in keyed]
        ) from None


def links_problems(value: str) -> list[Problem]:
    """Every problem of `runtime.links=value` (none: it reads)."""
    try:
        links_of(value)
    except ConfigError as e:
        return list(e.problems)
    return []
