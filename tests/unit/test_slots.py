"""Slots and pages: DCP localization of logical slots, and the page ids plans take."""

from __future__ import annotations

import pytest
import torch

from pipeline.spec.slots import localize, page_tokens, pages_of


def test_dcp_1_is_identity() -> None:
    """Without DCP every logical slot is a local row."""
    slots = page_tokens([3, 0, 7], 4)
    assert torch.equal(localize(slots, 4, 1, 0), slots)


@pytest.mark.parametrize("dcp", [2, 4])
def test_rank_gets_strided_slots(dcp: int) -> None:
    """Rank r holds logical slot s = r (mod dcp) at row s // dcp."""
    slots = page_tokens([5, 1, 2], 4 * dcp)
    for rank in range(dcp):
        assert localize(slots, 4, dcp, rank).tolist() == (slots[rank::dcp] // dcp).tolist()


@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_plan_page_ids_are_every_dcp_ranks_local_pages(dcp: int) -> None:
    """The page ids a plan takes (and UploadPageIds moves) are every DCP rank's local rows,
    per page: one set of ids serves every rank."""
    slots = page_tokens([7, 0, 3, 4], 4 * dcp)
    pages = pages_of("host_indices", slots, 4 * dcp, 64 * dcp)
    for rank in range(dcp):
        assert pages.tolist() == (localize(slots, 4, dcp, rank)[::4] // 4).tolist()


@pytest.mark.parametrize("dcp", [2, 4])
def test_widened_pages_become_whole_local_pages(dcp: int) -> None:
    """Widened page p (page_size x dcp slots) is local page p on every rank, rows in order."""
    pages = [5, 1, 2]
    slots = page_tokens(pages, 4 * dcp)
    for rank in range(dcp):
        rows = localize(slots, 4, dcp, rank)
        assert rows.tolist() == page_tokens(pages, 4).tolist()
        assert len(rows) == len(slots) // dcp


def test_explicit_rows_for_dcp_2() -> None:
    """Page 1 of 8 logical slots (8..15) splits into even and odd slots, both local page 1."""
    slots = torch.arange(8, 16)
    assert localize(slots, 4, 2, 0).tolist() == [4, 5, 6, 7]
    assert localize(slots, 4, 2, 1).tolist() == [4, 5, 6, 7]
    assert slots[0::2].tolist() == [8, 10, 12, 14]


@pytest.mark.parametrize(("n", "dcp"), [(4, 2), (6, 1), (24, 4)])
def test_rejects_partial_widened_pages(n: int, dcp: int) -> None:
    """A length that is not whole widened pages is refused with the page arithmetic."""
    with pytest.raises(
        ValueError,
        match=rf"{n} slots are not whole widened pages of {4 * dcp} \(page_size 4 x "
        rf"dcp_size {dcp}\)",
    ):
        localize(torch.arange(n), 4, dcp, 0)
