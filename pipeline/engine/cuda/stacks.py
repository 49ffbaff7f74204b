"""Stacked views: units of one pool kind evenly spaced in one buffer, as one tensor, and
as the integers a copy call of all of them takes (made once per set of units)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from pipeline.core.model import Unit
from pipeline.engine.cuda.memcpy import StackPages, stack_pages

K = TypeVar("K")
T = TypeVar("T")

KEPT = 4096
"""Keys a `remembered` memo holds (each asked on every transfer) before it starts over."""


def stack_views(views: list[torch.Tensor]) -> torch.Tensor | None:
    """Evenly spaced, same-shaped views of one buffer as one [n, *shape] view, or None.

    A pool keeps its units of one kind in one buffer, so the units a rank copies (all of
    them, or every group_size-th) stack: one kernel or copy call then covers them all.
    """
    first = views[0]
    step = views[1].storage_offset() - first.storage_offset() if len(views) > 1 else 0
    for i, v in enumerate(views):
        if (
            v.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or v.shape != first.shape
            or v.stride() != first.stride()
            or v.storage_offset() != first.storage_offset() + i * step
        ):
            return None
    if len(views) > 1 and step <= 0:
        return None
    return first.as_strided((len(views), *first.shape), (step, *first.stride()))


class StackedViews:
    """Per set of units, their words views stacked (`stack_views`), made once per set."""

    def __init__(self, words: Mapping[int, torch.Tensor]) -> None:
        self._words = words
        self._stacks: dict[tuple[int, ...], torch.Tensor | None] = {}
        self._seen: dict[int, tuple[tuple[Unit, ...], torch.Tensor | None]] = {}
        """By id of a units tuple (kept alive here, so its id is not reused): its stack,
        without hashing every unit of it on the issue path."""
        self._pages: dict[int, tuple[tuple[Unit, ...], StackPages | None]] = {}

    def __call__(self, units: tuple[Unit, ...]) -> torch.Tensor | None:
        return remembered(self._seen, units, self._stack)

    def pages(self, units: tuple[Unit, ...]) -> StackPages | None:
        """The stack of `units` as copy calls take it (made once per units tuple)."""
        return remembered(self._pages, units, self._stack_pages)

    def _stack(self, units: tuple[Unit, ...]) -> torch.Tensor | None:
        key = tuple(u.ordinal for u in units)
        if key not in self._stacks:
            self._stacks[key] = stack_views([self._words[o] for o in key])
        return self._stacks[key]

    def _stack_pages(self, units: tuple[Unit, ...]) -> StackPages | None:
        stack = self(units)
        return None if stack is None else stack_pages(stack)


def remembered(memo: dict[int, tuple[K, T]], key: K, make: Callable[[K], T]) -> T:
    """`make(key)`, remembered by the identity of `key` (kept alive in `memo`, so its id is
    not reused: a step's units tuple, a pool's view) for at most `KEPT` keys before the memo
    starts over. Identity, not equality: hashing a key costs the issue path per call."""
    seen = memo.get(id(key))
    if seen is not None and seen[0] is key:
        return seen[1]
    made = make(key)
    if len(memo) >= KEPT:
        memo.clear()
    memo[id(key)] = (key, made)
    return made
