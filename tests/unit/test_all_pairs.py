"""The test grids' all-pairs subset (tests/conftest.py): every pair of any two factors' values
of the full grid occurs in it, and it is smaller than the grid."""

from __future__ import annotations

import itertools

from conftest import all_pairs


def test_every_pair_of_the_grid_occurs_in_its_all_pairs_subset() -> None:
    factors = [("a", "b", "c"), (1, 2, 3), ("x", "y"), (0, 3), (True, False)]
    grid = list(itertools.product(*factors))
    chosen = all_pairs(grid)
    assert set(chosen) <= set(grid) and len(chosen) < len(grid)
    for i, j in itertools.combinations(range(len(factors)), 2):
        seen = {(point[i], point[j]) for point in chosen}
        assert seen == set(itertools.product(factors[i], factors[j])), (i, j)
