"""docs/sglang.md's table of SGLang's host pool buffers is what SGLang 0.5.23's own
`init_kv_buffer` allocates (read from its installed source: the pool classes import GPU
kernels, so they are not built here) and what `tests/sglangfns.py`'s stand-in pools hold, for
every layout, MLA and MHA."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest
from sglangfns import HostPool

DOC = (Path(__file__).resolve().parents[2] / "docs" / "sglang.md").read_text()
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
SIZES = {"layers": 3, "pages": 5, "page_size": 4, "tokens": 20, "heads": 2, "head_dim": 8}
SIZES |= {"kv_lora_rank + rope dim": 32, "1": 1, "2": 2}
DOC_NAMES = {"layer_num": "layers", "size": "tokens", "page_num": "pages", "page_size": "page_size"}
DOC_NAMES |= {
    "kv_cache_dim": "kv_lora_rank + rope dim",
    "head_num": "heads",
    "head_dim": "head_dim",
}
"""SGLang's pool attributes -> the table's words for them."""


def documented(layout: str) -> tuple[list[str], list[str]]:
    """The MLA and MHA dims the table gives for `layout`, in its words."""
    row = re.search(rf"^\| `{layout}` \| `\[(.*?)\]` \| `\[(.*?)\]` \|$", DOC, re.M)
    assert row is not None, f"docs/sglang.md has no pool row for {layout}"
    mla, mha = ([d.strip() for d in cell.split(",")] for cell in row.groups())
    return mla, mha


def sglang_dims(module: str, pool: str) -> dict[str, list[str]]:
    """Per layout, the dims `pool.init_kv_buffer` in SGLang's `module` gives, in the table's
    words (`self.x` by its name, numbers as they are)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("needs SGLang: pip install --no-deps sglang==0.5.23")
    source = Path(spec.origin).parent / "srt" / "mem_cache" / "pool_host" / f"{module}.py"
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == pool)
    init = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "init_kv_buffer"
    )
    found = {}
    for node in ast.walk(init):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            layout = node.test.comparators[0]
            dims = node.body[0]
            if (
                isinstance(layout, ast.Constant)
                and isinstance(dims, ast.Assign)
                and isinstance(dims.value, ast.Tuple)  # `dims = (...)`; other layouts differ
            ):
                found[layout.value] = [word(e) for e in dims.value.elts]
    return found


def word(element: ast.expr) -> str:
    if isinstance(element, ast.Attribute):
        return DOC_NAMES[element.attr]
    assert isinstance(element, ast.Constant), ast.dump(element)
    return str(element.value)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_documented_pool_shapes_are_what_sglang_allocates(layout: str) -> None:
    mla = sglang_dims("mla", "MLATokenToKVPoolHost")[layout]
    mha = sglang_dims("mha", "MHATokenToKVPoolHost")[layout]
    assert documented(layout) == (mla, mha)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_stand_in_pools_hold_the_documented_shapes(layout: str) -> None:
    common = {"layout": layout, "page_num": 5, "page_size": 4, "layer_num": 3}
    mla = HostPool(mla=True, kv_cache_dim=32, **common)
    mha = HostPool(mla=False, head_num=2, head_dim=8, **common)
    doc_mla, doc_mha = documented(layout)
    assert (mla.dims(), mha.dims()) == (
        tuple(SIZES[d] for d in doc_mla),
        tuple(SIZES[d] for d in doc_mha),
    )
