"""The public API as engines combine it, at tp1: every model kind (MLA, DSA, MHA) x
chunk_pages (0, 1, 2 and the odd 3) x adopted KV (none, one tensor per layer, one stacked
tensor per pool kind) x store (none, file), through backup, load, write-back and
load_from_l3, all bit-exact (`gridfns.run_case`); non-contiguous views refused saying so.

Design: the whole product, 3 x 4 x 3 x 2 = 72 engines (11 s on 2 cores). Strategy is no
factor at tp1: single_source and rotating fall back to replicated there (compose resolves
it, and `test_fallbacks_leave_these_engine_kinds` pins that), so the engine is the same.
tp2 on gloo ranks is `tests/distributed/test_api_grid_tp2.py`; cuda, `tests/gpu`.
"""

from __future__ import annotations

from pathlib import Path

import gridfns
import pytest

import pipeline


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("case", gridfns.whole_product(tp=1), ids=str)
def test_every_combination_moves_its_pages_bit_exact(case: gridfns.Case, tmp_path: Path) -> None:
    assert gridfns.run_case(case, case.job(tmp_path)) == ""


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("how", ["per_layer", "stacked"])
@pytest.mark.parametrize("model", gridfns.MODELS)
def test_adopted_views_that_are_not_contiguous_are_refused_saying_so(model: str, how: str) -> None:
    job = gridfns.Case(model, "replicated", 0, "none", "none").job(None)
    said = gridfns.refusal(job, f"{how}_strided", "cpu")
    assert said.startswith("device_kv[('kv', 0)]: not contiguous (strides "), said
    assert "a .contiguous() copy would not be your KV" in said


@pytest.mark.parametrize("tp", [1, 2])
def test_fallbacks_leave_these_engine_kinds(tp: int) -> None:
    """What every strategy x model becomes after compose's fallback: the grids run these."""
    asked = [
        gridfns.Case(m, s, 0, "none", "none", tp)
        for m in gridfns.MODELS
        for s in gridfns.STRATEGIES
    ]
    kinds = {
        (case.model, pipeline.compose(case.overrides()).strategy.config.name) for case in asked
    }
    assert sorted(kinds) == sorted(gridfns.engine_kinds(tp))
