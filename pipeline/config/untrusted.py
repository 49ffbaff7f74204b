"""Config input from strangers, checked before Hydra sees any of it.

A user config folder is read here, never by Hydra: each file is size-capped and scanned as YAML
tokens before anything is built (tags, anchors and aliases, directives and `@package` headers
are refused, so no tag constructs an object and no alias bomb expands), then checked against
its group's schema. Only checked data reaches Hydra, through the ConfigStore (overrides are
checked in `overrides`). No message quotes a resolver call's result: refused values are never
resolved.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from pipeline.config.reach import FILES_READ, endpoint_problems, folder_paths, reach_problems
from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.config.schema_check import schema_problems, without
from pipeline.core.checks import ConfigError, Problem

MAX_FILE_BYTES = 64 * 1024
"""Largest config file read (the shipped ones are under 2 KiB)."""
RESOLVER = re.compile(r"\$\{[^}]*:")
"""`${name:...}`: a resolver call (oc.env reads the environment); plain `${a.b}` is fine."""
REFUSED_TOKENS: dict[type, str] = {
    yaml.TagToken: "YAML tags are not allowed",
    yaml.AnchorToken: "YAML anchors are not allowed",
    yaml.AliasToken: "YAML aliases are not allowed",
    yaml.DirectiveToken: "YAML directives are not allowed",
}


@dataclass(frozen=True)
class UserOption:
    """One checked option of a user config folder, as Hydra will get it."""

    group: str
    name: str
    path: str
    data: dict[str, Any]
    """The file's data, without any key a problem names (the rest still composes)."""
    lines: dict[str, int]
    """Dotted key -> line in the file."""


def read_yaml(path: Path) -> tuple[dict[str, Any] | None, dict[str, int], list[Problem]]:
    """(data, key lines, problems) of one YAML file; data is None when it cannot be read."""
    shown = str(path)
    try:
        raw = read_capped(path)
    except OSError as e:
        return None, {}, [Problem("", f"not read: {e.strerror or e}").at(shown)]
    if len(raw) > MAX_FILE_BYTES:
        return None, {}, [Problem("", f"larger than {MAX_FILE_BYTES} bytes").at(shown)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, {}, [Problem("", "not UTF-8 text").at(shown)]
    found = [
        Problem("", "a @package header is not allowed: options fill their own group").at(shown, i)
        for i, line in enumerate(text.splitlines(), 1)
        if re.match(r"\s*#\s*@package", line)
    ]
    try:
        found += _refused_tokens(text, shown)
        if found:
            return None, {}, found
        node = yaml.compose(text, Loader=yaml.SafeLoader)  # no tags or aliases: plain data
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        line = mark.line + 1 if mark else None
        problem = Problem("", f"YAML syntax error ({where}): {e.problem}")
        return None, {}, [*found, problem.at(shown, line)]
    except yaml.YAMLError as e:  # unreadable characters and the like: no place to point at
        return None, {}, [*found, Problem("", f"not readable as YAML: {e}").at(shown)]
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        return None, {}, [Problem("", "must be a mapping of config keys").at(shown)]
    return data, dict(_key_lines(node, "")), []


def read_capped(path: Path) -> bytes:
    """At most `MAX_FILE_BYTES` + 1 bytes of the regular file `path`, opened without following
    a link (a link could name any file the user can read, and its values would be echoed in
    errors) and without blocking (a FIFO); OSError for anything else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file (a link, a FIFO or a device is refused)")
        chunks, left = [], MAX_FILE_BYTES + 1
        while left and (chunk := os.read(fd, left)):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _refused_tokens(text: str, shown: str) -> list[Problem]:
    """Tags, anchors, aliases and directives, each kind once at its first line, found by the
    scanner alone (nothing is built, so an alias bomb never expands)."""
    found, seen = [], set()
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        kind = type(token)
        if kind in REFUSED_TOKENS and kind not in seen:
            seen.add(kind)
            found.append(Problem("", REFUSED_TOKENS[kind]).at(shown, token.start_mark.line + 1))
    return found


def _key_lines(node: Any, prefix: str) -> Iterator[tuple[str, int]]:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = f"{prefix}.{key.value}" if prefix else str(key.value)
            yield path, key.start_mark.line + 1
            yield from _key_lines(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            yield f"{prefix}[{i}]", value.start_mark.line + 1
            yield from _key_lines(value, f"{prefix}[{i}]")


def option_problems(
    group: str, data: dict[str, Any], options: set[str], root: Path, endpoints: Sequence[str] = ()
) -> list[Problem]:
    """What an option file of `group` in the folder `root` may not hold: `hydra` keys,
    resolver calls, a defaults list that reaches beyond its group's options, a file outside
    the folder or a listener beyond loopback, and keys or types its schema refuses."""
    found = reach_problems(group, data, root)
    if "hydra" in data:
        found.append(Problem(f"{group}.hydra", "hydra.* may not be set from a config file"))
    defaults = data.get("defaults", [])
    allowed = options | {"_self_", f"base_{group}"}
    if not isinstance(defaults, list) or any(
        not isinstance(d, str) or d not in allowed for d in defaults
    ):
        found.append(
            Problem(
                f"{group}.defaults",
                f"{group}.defaults may list only options of the {group} group and _self_ "
                f"(options: {', '.join(sorted(options))})",
            )
        )
    if group == "storage":
        found += endpoint_problems(data, endpoints)
    for key, value in strings(data, group):
        if RESOLVER.search(value):
            found.append(Problem(key, f"{key} calls a resolver: only ${{key}} references"))
    fields = {k: v for k, v in data.items() if k not in ("defaults", "hydra")}
    return found + schema_problems(fields, GROUP_SCHEMAS[group], group)


def strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{path}[{i}]")


def read_config_dir(
    folder: str, shipped: dict[str, set[str]], allowed: Sequence[str] = ()
) -> tuple[list[UserOption], list[Problem]]:
    """Every option of a user config folder, checked; and every problem, with file and line.

    Only `<group>/<name>.yaml` files of the schema'd groups are read: anything else that Hydra
    would have read (a primary `config.yaml`, a `hydra/` folder) is refused, and so is a file
    that shadows a shipped option (Hydra would silently ignore it); a YAML file that an
    option names (a links file) is no option, and no stray."""
    root = Path(folder)
    if not root.is_dir():
        return [], [Problem("", f"--config-dir {folder}: not a folder")]
    options, found, strays = [], [], []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_dir() or path.suffix not in (".yaml", ".yml"):
            continue
        if len(relative.parts) != 2 or relative.parts[0] not in GROUP_SCHEMAS:
            strays.append(path)
            continue
        group, name = relative.parts[0], path.stem
        if name in shipped[group]:
            message = f"shadows the shipped option {group}/{name}: give it another name"
            found.append(Problem(f"{group}", message).at(str(path)))
            continue
        data, lines, problems = read_yaml(path)
        if data is not None:
            names = shipped[group] | {p.stem for p in (root / group).glob("*.y*ml")}
            problems = option_problems(group, data, names - {name}, root, allowed)
            clean = folder_paths(group, without(data, problems, group), root)
            options.append(UserOption(group, name, str(path), clean, lines))
        found += [p.at(str(path), p.line or lines.get(p.key.partition(".")[2])) for p in problems]
    named = {v for o in options for k, v in o.data.items() if f"{o.group}.{k}" in FILES_READ}
    groups = ", ".join(GROUP_SCHEMAS)
    stray = Problem("", f"not an option of a config group ({groups})")
    found += [stray.at(str(p)) for p in strays if str(p.resolve()) not in named]
    return options, found


MAX_SWEEP_JOBS = 256


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The overrides of each job of a sweep (`-m`): every `key=a,b` (or `range(...)`,
    `choice(...)`) expanded, the product taken in command-line order. Each job's overrides are
    checked again as it is composed."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:
        raise ConfigError(
            [Problem("", f"cannot parse the overrides: {str(e).splitlines()[0]}", "overrides")]
        ) from None
    # at most one job more than allowed from each sweep: a range of millions is never built
    choices = [
        [
            f"{o.get_key_element()}={v}"
            for v in itertools.islice(o.sweep_string_iterator(), MAX_SWEEP_JOBS + 1)
        ]
        if o.is_sweep_override()
        else [text]
        for o, text in zip(parsed, overrides, strict=True)
    ]
    count = math.prod(len(c) for c in choices)
    if count > MAX_SWEEP_JOBS:
        raise ConfigError(
            [
                Problem(
                    "",
                    f"a sweep of more than {MAX_SWEEP_JOBS} jobs: at most {MAX_SWEEP_JOBS}",
                    "overrides",
                )
            ]
        )
    return [list(job) for job in itertools.product(*choices)]
