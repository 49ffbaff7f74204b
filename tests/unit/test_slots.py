"""Slots and pages: with DCP, the page ids plans take are every DCP rank's local pages."""

from __future__ import annotations

import random

import pytest
import torch

from pipeline.core import slots
from pipeline.core.slots import page_rows, page_tokens, pages_of


def rows(slots: torch.Tensor, dcp: int, rank: int) -> torch.Tensor:
    """DCP rank `rank`'s local rows of logical slots: slot s lives on rank s % dcp at row
    s // dcp (the mapping the plan's page ids stand for)."""
    return slots[rank::dcp] // dcp


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_plan_page_ids_are_every_dcp_ranks_local_pages(dcp: int) -> None:
    """The page ids a plan takes (and UploadPageIds moves) are every DCP rank's local rows,
    per page: one set of ids serves every rank."""
    slots = page_tokens([7, 0, 3, 4], 4 * dcp)
    pages = pages_of("host_indices", slots, 4 * dcp, 64 * dcp)
    for rank in range(dcp):
        assert pages.tolist() == (rows(slots, dcp, rank)[::4] // 4).tolist()


@pytest.mark.parametrize("dcp", [2, 4])
def test_widened_pages_become_whole_local_pages(dcp: int) -> None:
    """Widened page p (page_size x dcp slots) is local page p on every rank, rows in order."""
    pages = [5, 1, 2]
    slots = page_tokens(pages, 4 * dcp)
    for rank in range(dcp):
        assert rows(slots, dcp, rank).tolist() == page_tokens(pages, 4).tolist()


def test_explicit_rows_for_dcp_2() -> None:
    """Page 1 of 8 logical slots (8..15) splits into even and odd slots, both local page 1."""
    slots = torch.arange(8, 16)
    assert rows(slots, 2, 0).tolist() == [4, 5, 6, 7]
    assert rows(slots, 2, 1).tolist() == [4, 5, 6, 7]
    assert slots[0::2].tolist() == [8, 10, 12, 14]


def _mutations(slots: torch.Tensor, per_page: int) -> list[torch.Tensor]:
    """`slots` and ways a caller gets it wrong: one slot off, two swapped (inside a page and
    across pages), a page twice, out of range (negative, past the pool, near 2**63), shifted
    off alignment, cut short, widened, another dtype, 2-D."""
    n = len(slots)
    out = [slots.clone() for _ in range(6)]
    out[0][n // 2] += 1
    out[1][[0, 1]] = out[1][[1, 0]]
    out[2][[0, n - 1]] = out[2][[n - 1, 0]]
    out[3][-per_page:] = slots[:per_page]
    out[4][:per_page] -= 10**6 * per_page
    out[5][-per_page:] += 2**62
    return [
        slots,
        *out,
        slots + 1,
        slots[:-1],
        torch.cat([slots, slots[:per_page] + 10**4 * per_page]),
        slots.to(torch.int32),
        slots.reshape(1, -1),
        slots[:0],
    ]


def _outcome(check, *args):
    try:
        return check(*args).tolist()
    except ValueError as e:
        return str(e)


@pytest.mark.parametrize("per_page", [1, 4, 8])
@pytest.mark.parametrize("seed", range(3))
def test_page_rows_takes_and_refuses_what_pages_of_does_on_each_side(per_page, seed) -> None:
    """The issue path checks both sides at once (`page_rows`); every pair of a grid of
    well-formed and malformed slots gets the pages, or the error, that two `pages_of` and
    the length check give, in that order."""
    rng = random.Random(seed)
    host = page_tokens(rng.sample(range(64), 6), per_page)
    device = page_tokens(rng.sample(range(96), 6), per_page)
    host_slots, device_slots = 64 * per_page, 96 * per_page

    def per_side(h, d):
        pages = (
            pages_of("host_indices", h, per_page, host_slots),
            pages_of("device_indices", d, per_page, device_slots),
        )
        if len(h) != len(d):
            raise ValueError(
                f"host_indices has {len(h)} slots and device_indices "
                f"{len(d)}: pass one device slot per host slot"
            )
        return torch.stack(pages)

    for h in _mutations(host, per_page):
        for d in _mutations(device, per_page):
            args = (h, d, per_page, host_slots, device_slots)
            assert _outcome(page_rows, *args) == _outcome(per_side, h, d)


def test_well_formed_slots_are_checked_without_the_per_side_path(monkeypatch) -> None:
    """What the issue-time saving rests on: well-formed slots never reach `pages_of`."""

    def refuse(*args):
        raise AssertionError("pages_of called for well-formed slots")

    monkeypatch.setattr(slots, "pages_of", refuse)
    host, device = page_tokens([3, 0, 7], 8), page_tokens([1, 9, 2], 8)
    pages = page_rows(host, device, 8, 8 * 8, 16 * 8)
    assert [p.tolist() for p in pages] == [[3, 0, 7], [1, 9, 2]]
