"""Range checks that config dataclasses run in `__post_init__` (so `validate` sees them)."""

from __future__ import annotations


def require_at_least(section: str, obj: object, **least: int | float) -> None:
    """Each named number of `obj` must be >= its least value: ValueError naming the key.

    Booleans and non-numbers are left to the schema's type check.
    """
    for name, floor in least.items():
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if value < floor:
            raise ValueError(f"{section}.{name}={value!r} must be >= {floor}")


def require_positive(section: str, obj: object, *names: str) -> None:
    """Each named field must be a positive integer: ValueError naming the key."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{section}.{name}={value!r} must be a positive integer")
