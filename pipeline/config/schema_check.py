"""Raw config data against a schema dataclass: every unknown key and wrong type, not the first.

Hydra stops composing at the first type error of a file; this walks a file's plain data (as
the hardened loader read it) and lists them all, so `validate` reports every mistake at once.
Range and cross-field rules run afterwards, in the dataclasses themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from enum import Enum
from typing import Any

from pipeline.core.checks import Problem

SCALARS: dict[type, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    str: (str, int, float),
}
"""What each scalar field accepts (a YAML number is a fine string; a bool is never a number)."""


def shown(value: Any, limit: int = 40) -> str:
    """A value as a message may quote it: short, one line, control characters escaped."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """'; did you mean X?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def not_a_field(path: str, schema: type) -> Problem:
    """A key the schema does not declare (names the fields it does, and the closest)."""
    names = [f.name for f in dataclasses.fields(schema)]
    head, _, last = path.rpartition(".")
    guess = did_you_mean(last, names, f"{head}." if head else "")
    message = f"{path}: not a field of {schema.__name__} (known: {', '.join(names)}){guess}"
    return Problem(path, message)


def schema_problems(data: Any, schema: type, prefix: str) -> list[Problem]:
    """Every unknown key and wrong type of `data` as a `schema` mapping (`prefix`: its key)."""
    if not isinstance(data, dict):
        return [Problem(prefix, f"{prefix} must be a mapping of {schema.__name__} fields")]
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}
    found = []
    for key, value in data.items():
        path = f"{prefix}.{key}"
        if key not in fields:
            found.append(not_a_field(path, schema))
        else:
            found += value_problems(value, hints[key], path)
    return found


def value_problems(value: Any, hint: Any, path: str) -> list[Problem]:
    """Whether one value fits a field's annotated type (interpolations are typed later)."""
    if hint is Any or (isinstance(value, str) and "${" in value):
        return []
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        (inner,) = [a for a in args if a is not type(None)]
        return value_problems(value, inner, path)
    if value is None:
        return [Problem(path, f"{path} may not be null")]
    if origin is list:
        if not isinstance(value, list):
            return [Problem(path, f"{path} must be a list, not {shown(value)}")]
        return [p for i, v in enumerate(value) for p in value_problems(v, args[0], f"{path}[{i}]")]
    if dataclasses.is_dataclass(hint):
        return schema_problems(value, hint, path)  # type: ignore[arg-type]
    if isinstance(hint, type) and issubclass(hint, Enum):
        if isinstance(value, str) and value in hint.__members__:
            return []
        names = sorted(hint.__members__)
        guess = did_you_mean(value, names) if isinstance(value, str) else ""
        return [Problem(path, f"{path}={shown(value)} is not one of {names}{guess}")]
    accepted = SCALARS[hint]
    if isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted):
        return []
    article = "an" if hint.__name__[0] in "aeiou" else "a"
    return [Problem(path, f"{path}={shown(value)} is not {article} {hint.__name__}")]


def without(data: dict[str, Any], problems: list[Problem], prefix: str) -> dict[str, Any]:
    """A copy of `data` without the keys the problems name, so the rest can still compose
    (and its range rules be checked in the same `validate`)."""
    clean = copy.deepcopy(data)
    for problem in problems:
        parts = problem.key.removeprefix(prefix + ".").split(".")
        node: Any = clean
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        last = parts[-1].split("[")[0]
        if isinstance(node, dict):
            node.pop(last, None)
    return clean
