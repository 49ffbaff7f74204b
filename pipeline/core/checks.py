"""Config mistakes as data: every check collects all it finds, so one run reports them all.

Config dataclasses run their checks in `__post_init__` and raise one `ConfigError` holding
every `Problem`; `validate` adds each problem's file and line. Checks never echo a value they
were not asked to check (a mistake elsewhere in a config may hold a secret).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One config mistake: the key to fix and what is wrong (and where, once known)."""

    key: str
    """Dotted config key, e.g. 'strategy.chunk_pages' ('' for a whole file or command line)."""
    message: str
    """One line that names the key and the fix."""
    file: str | None = None
    line: int | None = None

    def at(self, file: str | None, line: int | None = None) -> Problem:
        return dataclasses.replace(self, file=file, line=line)

    def as_dict(self) -> dict[str, object]:
        return {"file": self.file, "key": self.key, "line": self.line, "message": self.message}

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.message}" if where else self.message


class ConfigError(ValueError):
    """A config that cannot run, with every problem found (exit 2 at the command line)."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        assert self.problems, "a ConfigError holds at least one problem"
        super().__init__("; ".join(str(p) for p in self.problems))


def raise_problems(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError(problems)


LARGEST_NUMBER = 1e15
"""No knob means anything beyond this (a timeout of 31 million years, a quadrillion bytes):
larger values, nan and inf are refused before they overflow somewhere downstream."""


def at_least(section: str, obj: object, **least: int | float) -> list[Problem]:
    """Each named number of `obj` that is below its least value, not finite, or beyond
    `LARGEST_NUMBER` (non-numbers are left to the schema's type check)."""
    found = []
    for name, floor in least.items():
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isfinite(value) or abs(value) > LARGEST_NUMBER:
            key = f"{section}.{name}"
            found.append(Problem(key, f"{key}={value!r} must be a finite number below 1e15"))
        elif value < floor:
            key = f"{section}.{name}"
            found.append(Problem(key, f"{key}={value!r} must be >= {floor}"))
    return found


def finite(section: str, obj: object, *names: str) -> list[Problem]:
    """Each named number that is nan, inf or beyond `LARGEST_NUMBER`."""
    return at_least(section, obj, **dict.fromkeys(names, -LARGEST_NUMBER))


def positive(section: str, obj: object, *names: str) -> list[Problem]:
    """Each named field that is not a positive integer."""
    found = []
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            key = f"{section}.{name}"
            found.append(Problem(key, f"{key}={value!r} must be a positive integer"))
    return found


def non_empty(section: str, obj: object, *names: str) -> list[Problem]:
    """Each named list that is empty (nothing would run, and nothing must look like success)."""
    found = []
    for name in names:
        if not getattr(obj, name):
            key = f"{section}.{name}"
            found.append(Problem(key, f"{key} is empty: list at least one value"))
    return found
