"""Stacked views: units of one pool kind evenly spaced in one buffer, as one tensor, and
as the integers a copy call of all of them takes (made once per set of units)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pipeline.engine.memcpy import StackPages, stack_pages
from pipeline.spec.model import Unit


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

    KEPT = 4096
    """Unit tuples remembered by identity (a step's, asked on every transfer) before the
    memo starts over."""

    def __init__(self, words: Mapping[int, torch.Tensor]) -> None:
        self._words = words
        self._stacks: dict[tuple[int, ...], torch.Tensor | None] = {}
        self._seen: dict[int, tuple[tuple[Unit, ...], torch.Tensor | None]] = {}
        """By id of a units tuple (kept alive here, so its id is not reused): its stack,
        without hashing every unit of it on the issue path."""
        self._pages: dict[int, tuple[tuple[Unit, ...], StackPages | None]] = {}

    def __call__(self, units: tuple[Unit, ...]) -> torch.Tensor | None:
        seen = self._seen.get(id(units))
        if seen is not None and seen[0] is units:
            return seen[1]
        key = tuple(u.ordinal for u in units)
        if key not in self._stacks:
            self._stacks[key] = stack_views([self._words[o] for o in key])
        if len(self._seen) >= self.KEPT:
            self._seen.clear()
        self._seen[id(units)] = (units, self._stacks[key])
        return self._stacks[key]

    def pages(self, units: tuple[Unit, ...]) -> StackPages | None:
        """The stack of `units` as copy calls take it (made once per units tuple)."""
        seen = self._pages.get(id(units))
        if seen is not None and seen[0] is units:
            return seen[1]
        stack = self(units)
        made = None if stack is None else stack_pages(stack)
        if len(self._pages) >= self.KEPT:
            self._pages.clear()
        self._pages[id(units)] = (units, made)
        return made
