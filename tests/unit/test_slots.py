"""Slots and pages: with DCP, the page ids plans take are every DCP rank's local pages."""

from __future__ import annotations

import pytest
import torch

from pipeline.spec.slots import page_tokens, pages_of


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
