"""The caller's KV tensors, in the layouts serving engines keep, as views of the same memory
shaped as the device pool's pages: [pages, rows per page, row elements] per unit.

Taken: one tensor per (pool kind, layer) as [pages, page_size, row elements] (vLLM's MLA
[num_blocks, block_size, head_size], where a block is a page); SGLang's MLA buffer
[tokens, 1, dim] in whole pages of tokens; one stacked [layers, pages, page_size, dim] tensor
per pool kind, under the kind's name (`device_kv["kv"]`). Anything else is refused saying
what was expected and what to do. Nothing is copied: a copy would not be the caller's KV.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping

import torch

from pipeline.core.model import ModelGeometry, Unit
from pipeline.engine.transfer.pools import unit_dtype

Key = tuple[str, int]
Adopted = Mapping[Key | str, torch.Tensor]
"""What a caller may hand over: tensors per (pool kind, layer), or stacked per pool kind."""


def page_views(model: ModelGeometry, tensors: Adopted) -> dict[Key, torch.Tensor]:
    """Per (pool kind, layer), the caller's tensor as [pages, rows per page, row elements]
    (a view of its memory); ValueError naming the first that cannot be one. Keys the model
    has no unit for pass through (the pool names them)."""
    units = {(u.pool, u.layer): u for u in model.units}
    views = {
        key: as_pages(model, units[key], key, t) if key in units else t
        for key, t in unstacked(model, tensors).items()
    }
    sized = [(key, t.shape[0]) for key, t in views.items() if key in units]
    for (first, pages), (key, other) in itertools.pairwise(sized):
        if other != pages:
            raise ValueError(
                f"device_kv[{key!r}]: {other} pages, and device_kv[{first!r}] has {pages}: "
                "give every layer the same pages"
            )
    return views


def unstacked(model: ModelGeometry, tensors: Adopted) -> dict[Key, torch.Tensor]:
    """One tensor per (pool kind, layer): each stacked kind's layers as views of it."""
    views: dict[Key, torch.Tensor] = {k: t for k, t in tensors.items() if not isinstance(k, str)}
    for kind in [k for k in tensors if isinstance(k, str)]:
        t = tensors[kind]
        units = [u for u in model.units if u.pool == kind]
        if t.dim() != 4:
            raise ValueError(
                f"device_kv[{kind!r}]: need a stacked [layers, pages, page_size, dim] tensor; "
                f"got {tuple(t.shape)}"
            )
        if t.shape[0] != len(units):
            raise ValueError(
                f"device_kv[{kind!r}]: a stacked tensor of {t.shape[0]} layers; the model has "
                f"{len(units)} {kind} layers (model={model.name})"
            )
        for i, unit in enumerate(units):
            if (kind, unit.layer) in views:
                raise ValueError(
                    f"device_kv: {(kind, unit.layer)!r} is in device_kv[{kind!r}] too: give "
                    "each layer once"
                )
            views[(kind, unit.layer)] = t[i]
    return views


def as_pages(model: ModelGeometry, unit: Unit, key: Key, t: torch.Tensor) -> torch.Tensor:
    """One unit's tensor as [pages, rows per page, row elements], or ValueError saying what
    was expected and what to do."""
    name, shape = f"device_kv[{key!r}]", tuple(t.shape)
    rows, dtype = unit.rows_per_page, unit_dtype(model, unit)
    elems = unit.row_bytes // dtype.itemsize
    if t.dim() == 4:
        raise ValueError(
            f"{name}: a stacked [layers, pages, page_size, dim] tensor {shape}: give it whole as "
            f"device_kv={{{unit.pool!r}: t}}, or one view per layer ({{({unit.pool!r}, l): t[l]}})"
        )
    if t.dim() != 3:
        raise ValueError(
            f"{name}: need [pages, {rows}, {elems}] (pages, rows per page, row elements), or "
            f"SGLang's [tokens, 1, {elems}]; got {shape}"
        )
    if t.dtype != dtype:
        held = f"model.kv_dtype={model.kv_dtype.value}" if unit.pool == "kv" else "index-K"
        raise ValueError(f"{name}: dtype {t.dtype}; {held} keeps {dtype}")
    if shape[2] != elems:
        raise ValueError(f"{name}: rows of {shape[2]} elements; {row_source(model, unit, elems)}")
    if shape[1] == rows:
        return dense(name, t)
    if shape[1] != 1:
        raise ValueError(
            f"{name}: [blocks, block_size, dim] with block_size {shape[1]} but "
            f"model.page_size={model.page_size}: a block must be one page "
            f"(set model.page_size={shape[1]})"
        )
    if shape[0] % rows:
        raise ValueError(
            f"{name}: [tokens, 1, dim] of {shape[0]} tokens is not whole pages of "
            f"model.page_size={rows}: adopt t[:{shape[0] // rows * rows}]"
        )
    return dense(name, t).view(shape[0] // rows, rows, elems)


def row_source(model: ModelGeometry, unit: Unit, elems: int) -> str:
    """Where a unit's row width comes from, for a refusal."""
    if unit.pool == "kv":
        source = f"model.kv_row_bytes={unit.row_bytes} of {model.kv_dtype.value}"
    else:
        source = f"model.indexer.row_bytes x model.page_size = {unit.row_bytes} bytes"
    return f"model {model.name} keeps {elems} ({source})"


def dense(name: str, t: torch.Tensor) -> torch.Tensor:
    """`t` when its elements lie densely in row-major order, ValueError otherwise."""
    if t.is_contiguous():
        return t
    strides = tuple(itertools.accumulate(reversed(t.shape[1:]), operator.mul, initial=1))[::-1]
    raise ValueError(
        f"{name}: not contiguous (strides {t.stride()}; a dense {tuple(t.shape)} tensor has "
        f"{strides}): adopt the tensor your engine reads and writes, laid out densely (a "
        ".contiguous() copy would not be your KV)"
    )
