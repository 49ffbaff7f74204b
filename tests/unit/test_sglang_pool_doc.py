"""docs/sglang.md's table of SGLang's host pool buffers is the shape `tests/sglangfns.py` builds
(SGLang 0.5.23's `init_kv_buffer` dims) for every layout, MLA and MHA."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sglangfns import HostPool

DOC = (Path(__file__).resolve().parents[2] / "docs" / "sglang.md").read_text()
SIZES = {"layers": 3, "pages": 5, "page_size": 4, "tokens": 20, "heads": 2, "head_dim": 8}
SIZES |= {"kv_lora_rank + rope dim": 32, "1": 1, "2": 2}


def documented(layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The MLA and MHA shapes the table gives for `layout`, with SIZES put in."""
    row = re.search(rf"^\| `{layout}` \| `\[(.*?)\]` \| `\[(.*?)\]` \|$", DOC, re.M)
    assert row is not None, f"docs/sglang.md has no pool row for {layout}"
    mla, mha = (tuple(SIZES[d.strip()] for d in cell.split(",")) for cell in row.groups())
    return mla, mha


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_the_documented_pool_shapes_are_sglangs(layout: str) -> None:
    common = {"layout": layout, "page_num": 5, "page_size": 4, "layer_num": 3}
    mla = HostPool(mla=True, kv_cache_dim=32, **common)
    mha = HostPool(mla=False, head_num=2, head_dim=8, **common)
    assert documented(layout) == (mla.dims(), mha.dims())
