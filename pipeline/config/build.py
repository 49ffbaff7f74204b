"""Composed config nodes -> schema objects, with every problem of a group at once.

OmegaConf's `to_object` stops at the first missing field (with its own words) and runs no range
check of a group that misses one. Here a node's plain data builds its dataclass by hand: a
missing required field is named once, its range checks run with it left out, and a group whose
range checks fail is built again with those fields at their defaults (its *stand-ins*), so the
rules that join groups can still be checked. A problem the stand-ins cause is never reported.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pipeline.core.checks import ConfigError, Problem

log = logging.getLogger("hicache-pipeline.config")
MISSING = "???"
"""How OmegaConf's plain data shows a required field that nothing set."""


@dataclass(frozen=True)
class Built:
    """One group's object (None when it cannot be built), its problems, and the keys whose
    values are stand-ins (so a rule over them says nothing about the user's config)."""

    obj: Any
    problems: tuple[Problem, ...] = ()
    stand_ins: frozenset[str] = frozenset()


def built(node: DictConfig, schema: type, key: str) -> Built:
    """The schema object of a composed node, and every problem with it."""
    try:
        data = OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
    except Exception as e:  # a ${reference} to no key, or a reference loop
        log.debug("OmegaConf could not resolve %s: %s", key, e)
        message = f"{key}: a ${{...}} reference in it names no key (or loops): fix the reference"
        return Built(None, (Problem(key, message),), frozenset({key}))
    return build(schema, data, key)


def build(schema: type, data: Any, prefix: str) -> Built:
    """`schema` from plain data: nested sections first, then this one's own checks."""
    hints = typing.get_type_hints(schema)
    kwargs: dict[str, Any] = {}
    found: list[Problem] = []
    missing: set[str] = set()
    stood: set[str] = set()
    for f in dataclasses.fields(schema):
        path, value = f"{prefix}.{f.name}", data.get(f.name, MISSING)
        inner = nested(hints[f.name])
        if isinstance(value, str) and value == MISSING:
            missing.add(path)
            message = f"{path} is required: set it in the option's file or as {path}=..."
            found.append(Problem(path, message))
            kwargs[f.name] = None
        elif inner is not None and isinstance(value, dict):
            part = build(inner, value, path)
            found += part.problems
            stood |= part.stand_ins | ({path} if part.obj is None else set())
            kwargs[f.name] = part.obj if part.obj is not None else default(f, hints[f.name])
        else:
            kwargs[f.name] = value
    obj, problems = attempt(schema, kwargs, prefix)
    found += [p for p in problems if p.key not in missing]
    if obj is not None and not missing:
        return Built(obj, tuple(found), frozenset(stood))
    offending = {p.key for p in problems} | missing | stood
    names = {k.removeprefix(prefix + ".").split(".")[0].split("[")[0] for k in offending}
    fields = {f.name: f for f in dataclasses.fields(schema)}
    stand = {n: default(fields[n], hints[n]) for n in names if n in fields}
    if any(v is dataclasses.MISSING for v in stand.values()):
        return Built(None, tuple(found), frozenset(offending))
    obj, _ = attempt(schema, {**kwargs, **stand}, prefix)
    return Built(obj, tuple(found), frozenset(offending | {f"{prefix}.{n}" for n in stand}))


def attempt(schema: type, kwargs: dict[str, Any], prefix: str) -> tuple[Any, list[Problem]]:
    """(object, []) or (None, its checks' problems); a check that trips over a field left
    out (None) builds nothing and says nothing: that field's own problem stands."""
    try:
        return schema(**kwargs), []
    except ConfigError as e:
        return None, e.problems
    except Exception as e:  # a cross-field check reading a missing field
        log.debug("%s not checked further: %r", prefix, e)
        return None, []


def nested(hint: Any) -> type | None:
    """The dataclass a field holds (through `X | None`), or None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    inner = args[0] if typing.get_origin(hint) is not None and len(args) == 1 else hint
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


NEUTRAL: dict[Any, Any] = {int: 1, float: 1.0, str: "", bool: False}
"""Stand-ins for a required field of a plain type (a value every range check takes)."""


def default(f: dataclasses.Field, hint: Any) -> Any:
    """A field's default (a fresh one from its factory), or a neutral value of its type;
    `dataclasses.MISSING` for a required section."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    if f.default is not dataclasses.MISSING:
        return f.default
    if isinstance(hint, type) and issubclass(hint, Enum):
        return next(iter(hint))
    return NEUTRAL.get(hint, dataclasses.MISSING)
