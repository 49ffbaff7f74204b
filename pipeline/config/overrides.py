"""Overrides checked before Hydra sees them, each mistake in the project's own words.

Parsed with Hydra's grammar, then refused where they touch `hydra.*`, call a resolver or
sweep, or remove a group (`~model`); and checked against what exists: a group's options
(`strategy=rotatingg`), a group's or a section's keys (`strategy.chunk_page=8`), each value
against its field's type (`model.kv_dtype=bf17` names the allowed values), and a key inside a
section the config leaves null (`model.indexer.layers` of an MLA model: found by composing
without it). Each refusal names the override and the fix, with a did-you-mean; the overrides
that pass still compose, so their own range and cross-group rules are reported in the same
run. No message quotes a resolver call's result.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Collection, Mapping
from typing import Any

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from pipeline.config.schema import GROUP_SCHEMAS, Config
from pipeline.config.schema_check import did_you_mean, not_a_field, value_problems
from pipeline.config.untrusted import RESOLVER, strings
from pipeline.core.checks import Problem

ALLOWED_HYDRA_KEYS: frozenset[str] = frozenset()
"""`hydra.*` keys a user may set: none (this CLI composes configs; Hydra runs no job)."""
NUMBERS: dict[type, type] = {int: int, float: float}
NULL_SECTIONS = {
    "model.indexer": "only a DSA model has an indexer; pick one whose option sets "
    "model.indexer (e.g. model=deepseek_v32), or drop the override"
}
"""Optional sections (`X | None`) -> what to do where the config leaves one null."""


def parse_error(e: Exception) -> Problem:
    """Hydra's grammar error, first line only (it names the offending text)."""
    return Problem("", f"cannot parse the overrides: {str(e).splitlines()[0]}", "overrides")


def checked_overrides(
    overrides: list[str], options: Mapping[str, Collection[str]]
) -> tuple[list[Problem], list[str]]:
    """(every problem of the overrides, the overrides without one): `options` lists each
    group's options."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # Hydra's grammar errors: report the text, not a traceback
        return [parse_error(e)], []
    found, kept = [], []
    for override, text in zip(parsed, overrides, strict=True):
        problems = one_override(override, text, options)
        found += [p.at("overrides") for p in problems]
        if not problems:
            kept.append((override, text))
    null = null_section_problems(kept)
    found += [p.at("overrides") for p in null]
    refused = {p.key for p in null}
    return found, [text for o, text in kept if o.key_or_group not in refused]


def null_section_problems(kept: list[tuple[Any, str]]) -> list[Problem]:
    """Overrides into a section that the rest of the config leaves null (Hydra cannot set a
    key inside None, and says so without naming it), found by composing the rest."""
    inside = [
        (o.key_or_group, section)
        for o, _ in kept
        for section in NULL_SECTIONS
        if not o.is_delete()
        and (o.key_or_group + ".").startswith(section + ".")
        and not (o.key_or_group == section and o.value() is None)  # null stays null
    ]
    if not inside:
        return []
    rest = [text for o, text in kept if o.key_or_group not in dict(inside)]
    try:
        cfg = compose(config_name="config", overrides=rest)
    except Exception:  # the rest's own mistake: reported when it composes
        return []
    return [
        Problem(key, f"{key}: {section} is null here: {NULL_SECTIONS[section]}")
        for key, section in inside
        if OmegaConf.select(cfg, section) is None
    ]


def one_override(override: Any, text: str, options: Mapping[str, Collection[str]]) -> list:
    """The problems of one parsed override (at most one)."""
    key = override.key_or_group
    root = re.split(r"[./@]", key, maxsplit=1)[0]
    value = None if override.is_delete() else override.value()
    if (root == "hydra" and key not in ALLOWED_HYDRA_KEYS) or override.package == "hydra":
        return [Problem(key, f"{key}: hydra.* cannot be set (Hydra runs no job here)")]
    if override.is_sweep_override():
        return [Problem(key, f"{key}: a sweep; give one value per invocation (or use -m)")]
    if any(RESOLVER.search(s) for _, s in strings(value, key)):
        return [Problem(key, f"{key} calls a resolver: only ${{key}} references")]
    if root not in GROUP_SCHEMAS and root != "strict":
        names = [*GROUP_SCHEMAS, "strict"]
        return [
            Problem(
                root,
                f"{text}: no config group or key {root!r} (groups: {', '.join(GROUP_SCHEMAS)}; "
                f"key: strict){did_you_mean(root, names)}",
            )
        ]
    if key in GROUP_SCHEMAS and override.package is None and override.is_delete():
        known = ", ".join(sorted(options[key]))
        message = f"~{key}: a config group cannot be removed; pick one of its options ({known})"
        return [Problem(key, message)]
    if key in GROUP_SCHEMAS and override.package is None:
        return option_problems(key, value, options[key])
    return key_problems(key, value, override.is_delete())


def option_problems(group: str, value: Any, options: Collection[str]) -> list[Problem]:
    """`group=value` where value is no option of the group."""
    if isinstance(value, str) and value in options:
        return []
    known = ", ".join(sorted(options))
    if isinstance(value, str) and value.startswith("base_"):
        message = f"{group}={value}: that is the group's schema, not an option (options: {known})"
    else:
        message = (
            f"{group}={value}: no option {value!r} in group {group} (options: {known}; "
            f"`hicache-pipeline list` describes each){did_you_mean(str(value), options)}"
        )
    return [Problem(group, message)]


def key_problems(key: str, value: Any, delete: bool) -> list[Problem]:
    """A dotted key that no schema declares, or a value its field's type refuses."""
    schema: Any = Config
    hint: Any = Config
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(schema, type) or not dataclasses.is_dataclass(schema):
            return []  # inside a list or a free-form field: Hydra and the stage checks judge
        fields = typing.get_type_hints(schema)
        if part not in fields:
            return [not_a_field(".".join(parts[: depth + 1]), schema)]
        hint = fields[part]
        schema = section(hint)
    if delete or (isinstance(value, str) and "${" in value):
        return []
    if isinstance(value, str) and NUMBERS.get(hint) is not None and numeric(value):
        return []  # a quoted number: OmegaConf converts it
    return value_problems(value, hint, key)


def section(hint: Any) -> Any:
    """The dataclass a field holds (through `X | None`), else the hint itself."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is not None and len(args) == 1:
        return args[0] if dataclasses.is_dataclass(args[0]) else hint
    return hint


def numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
