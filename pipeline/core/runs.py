"""Runs: a transfer's pages that are consecutive on both the host and the device side.

One copy call moves a run, so the copy stage asks for the runs of each step; a fragmented
transfer has one run per page, so only what needs them makes them.
"""

from __future__ import annotations

import bisect
import itertools
from typing import NamedTuple

import numpy as np


class Run(NamedTuple):
    """Transfer pages consecutive on both sides (a tuple: unpacked once per copy call)."""

    first: int
    """Position of the run's first page in the transfer."""
    host_page: int
    device_page: int
    pages: int


def breaks(hosts: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Where a run ends (slices, not np.diff, and the mask's own nonzero, not np.flatnonzero:
    their Python wrappers cost more than this on small transfers)."""
    ends = (hosts[1:] - hosts[:-1] != 1) | (devices[1:] - devices[:-1] != 1)
    return ends.nonzero()[0] + 1


def runs_of(hosts: np.ndarray, devices: np.ndarray, ends: np.ndarray) -> tuple[Run, ...]:
    """The maximal runs, given where they end (`breaks`)."""
    bounds = [0, *ends.tolist(), len(hosts)]
    spans = list(itertools.pairwise(bounds))
    hp, dp = hosts[bounds[:-1]].tolist(), devices[bounds[:-1]].tolist()
    return tuple(Run(a, h, d, b - a) for (a, b), h, d in zip(spans, hp, dp, strict=True))


def clip(runs: tuple[Run, ...], first: int, end: int) -> tuple[Run, ...]:
    """`runs` cut to transfer pages [first, end)."""
    clipped = []
    start = bisect.bisect_right(runs, first, key=lambda r: r.first) - 1
    for r in runs[max(start, 0) :]:
        if r.first >= end:
            break
        lo, hi = max(r.first, first), min(r.first + r.pages, end)
        if lo < hi:
            shift = lo - r.first
            clipped.append(Run(lo, r.host_page + shift, r.device_page + shift, hi - lo))
    return tuple(clipped)
