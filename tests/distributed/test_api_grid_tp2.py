"""The API grid on 2 gloo ranks (real process groups; `pipeline.create_engine` in each rank's
default group): engine kind (strategy x model after fallback: replicated, single_source and
rotating for MLA and DSA, replicated for MHA) x chunk_pages (0, 1, 2, 3) x adopted KV (none,
per layer, stacked) x store (none, file), through backup, load, write-back and load_from_l3,
bit-exact on every rank; non-contiguous views refused on every rank.

Design: a covering array of strength 3 (`gridfns.every_triple`), 7 x 4 x 3 = 84 cases in one
spawn, instead of the whole product of 168. On the busy 2-core box the whole product took
63 s (composing its 168 configs 40 s of it, the spawn 23 s), past this grid's share of the
suite; the 84 cases take 31 s, and still every value of any three factors meets in some case.
The trap this grid was made for met two (one tensor per layer x chunk_pages >= 1, on every
strategy); strength 3 also meets each such pair with every engine kind and with each store,
where pairs alone (28 cases) would leave most of those meetings out.
`test_the_design_meets_every_triple` checks the design; the whole product runs on two GPUs
in `tests/gpu/test_api_grid_gpu.py`.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import gridfns
import pytest

from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed


def factors(case: gridfns.Case) -> tuple[object, ...]:
    return ((case.model, case.strategy), case.chunk_pages, case.adopted, case.store)


def test_the_design_meets_every_triple() -> None:
    cases = [factors(case) for case in gridfns.every_triple(tp=2)]
    levels = [sorted(set(values), key=str) for values in zip(*cases, strict=True)]
    assert [len(values) for values in levels] == [7, 4, 3, 2]
    for chosen in itertools.combinations(range(4), 3):
        met = {tuple(row[i] for i in chosen) for row in cases}
        wanted = set(itertools.product(*(levels[i] for i in chosen)))
        assert met == wanted, chosen


def test_every_triple_moves_its_pages_bit_exact_on_both_ranks(tmp_path: Path) -> None:
    cases = gridfns.every_triple(tp=2)
    grid = gridfns.Grid.of(cases, tmp_path)
    ranks = launch(gridfns.run_cases, grid, 2, backend="gloo", timeout_s=120, job_s=300)
    assert ranks is not None
    failed = {str(c): s for c, *s in zip(cases, *(r["cases"] for r in ranks), strict=True)}
    assert {case: said for case, said in failed.items() if any(said)} == {}
    for said in (message for r in ranks for message in r["refused"]):
        assert said.startswith("device_kv[('kv', 0)]: not contiguous (strides "), said
    assert all(len(r["refused"]) == 2 * len(gridfns.MODELS) for r in ranks)
