"""Progress of long work (bench cases, sweep jobs) on stderr, with an ETA: shown where stderr
is a terminal and on the first rank only, so logs, pipes and `--json` stay clean."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(
    items: Iterable[T], what: str, *, rank: int = 0, total: int | None = None
) -> Iterator[T]:
    shown = rank == 0 and sys.stderr.isatty()
    yield from tqdm(items, desc=what, total=total, file=sys.stderr, disable=not shown, leave=False)
