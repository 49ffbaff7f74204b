"""The model's KV geometry: layers, pools, rows and bytes, as units that move as a whole.

`ModelGeometry` is both the typed schema of the `model` config group and the plain object the
rest of the code reads (its `__post_init__` range checks run wherever it is built).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from pipeline.core.checks import Problem, positive, raise_problems

MAX_LAYERS = 4096
"""Most layers a model may have: plans, pools and checks walk every layer."""


class ModelKind(Enum):
    """mla: one latent KV that every TP rank holds whole; mha: KV heads split over ranks."""

    mla = "mla"
    mha = "mha"


class KvDtype(Enum):
    """Element type of the KV pool."""

    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp4 = "fp4"

    @property
    def itemsize(self) -> int:
        """Bytes per stored element (fp8 and fp4 are stored as packed uint8)."""
        return 2 if self in (KvDtype.bf16, KvDtype.fp16) else 1


@dataclass(frozen=True)
class Unit:
    """One layer's buffer that moves as a whole: a KV layer, or a DSA index-K layer."""

    ordinal: int
    """KV layer i has ordinal i; the j-th index-K layer has ordinal num_layers + j."""
    layer: int
    """Model layer the buffer belongs to (the forward waits per model layer)."""
    pool: str
    """'kv' (one row per token) or 'index' (one row per page)."""
    rows_per_page: int
    """Rows of this buffer in one page: page_size for kv, 1 for index."""
    row_bytes: int
    """Bytes of one row."""

    @property
    def page_bytes(self) -> int:
        return self.rows_per_page * self.row_bytes


def by_pool_kind(units: Iterable[Unit]) -> list[tuple[Unit, ...]]:
    """The units of each pool kind ('kv', then 'index'), in order; kinds without units left
    out. A pool keeps each kind in one buffer."""
    units = tuple(units)
    kinds = (tuple(u for u in units if u.pool == kind) for kind in ("kv", "index"))
    return [kind for kind in kinds if kind]


@dataclass(kw_only=True)
class IndexerConfig:
    """A DSA model's index-K pool."""

    row_bytes: int
    """Bytes of DSA index-K per token per indexer layer (stored one page per row)."""
    layers: list[int] | None = None
    """Model layers that carry an index-K buffer; null means every layer."""


@dataclass(kw_only=True)
class ModelGeometry:
    """What the KV cache of one model holds per token and layer."""

    name: str
    """Preset name, shown in reports."""
    kind: ModelKind
    """mla: one latent KV that every TP rank holds whole; mha: KV heads split over TP ranks."""
    num_layers: int
    """Attention layers whose KV the cache holds."""
    kv_row_bytes: int
    """Bytes per token per layer of the KV pool."""
    kv_dtype: KvDtype
    """Element type of the KV pool; fp8 and fp4 are stored as uint8."""
    page_size: int
    """Tokens per page; every transfer moves whole pages."""
    indexer: IndexerConfig | None = None
    """DSA index-K pool; null for models without one."""

    def __post_init__(self) -> None:
        raise_problems(self._problems())

    def _problems(self) -> list[Problem]:
        found = positive("model", self, "num_layers", "kv_row_bytes", "page_size")
        if isinstance(self.num_layers, int) and self.num_layers > MAX_LAYERS:
            found.append(
                Problem(
                    "model.num_layers",
                    f"model.num_layers={self.num_layers}: at most {MAX_LAYERS} layers",
                )
            )
        itemsize = self.kv_dtype.itemsize if isinstance(self.kv_dtype, KvDtype) else 1
        if isinstance(self.kv_row_bytes, int) and self.kv_row_bytes % itemsize:
            found.append(
                Problem(
                    "model.kv_row_bytes",
                    f"model.kv_row_bytes={self.kv_row_bytes} is not a whole number of "
                    f"{self.kv_dtype.value} elements ({itemsize} B): use a multiple of {itemsize}",
                )
            )
        if self.indexer is None:
            return found
        found += positive("model.indexer", self.indexer, "row_bytes")
        layers = self.indexer.layers or []
        bad = [x for x in layers if not 0 <= x < self.num_layers]
        if bad and not found:
            found.append(
                Problem(
                    "model.indexer.layers",
                    f"model.indexer.layers {bad} lie outside 0..{self.num_layers - 1}: "
                    f"list layers of this {self.num_layers}-layer model",
                )
            )
        if list(layers) != sorted(set(layers)):
            found.append(
                Problem(
                    "model.indexer.layers",
                    "model.indexer.layers must be increasing with no repeats",
                )
            )
        return found

    @property
    def indexer_layers(self) -> tuple[int, ...]:
        if self.indexer is None:
            return ()
        if self.indexer.layers is None:
            return tuple(range(self.num_layers))
        return tuple(self.indexer.layers)

    @functools.cached_property
    def units(self) -> tuple[Unit, ...]:
        """KV layers first, then index-K layers, in ordinal order (made once: every transfer
        plan reads them)."""
        kv = [
            Unit(
                ordinal=i,
                layer=i,
                pool="kv",
                rows_per_page=self.page_size,
                row_bytes=self.kv_row_bytes,
            )
            for i in range(self.num_layers)
        ]
        index_row_bytes = self.page_size * self.indexer.row_bytes if self.indexer else 0
        index = [
            Unit(
                ordinal=self.num_layers + j,
                layer=layer,
                pool="index",
                rows_per_page=1,
                row_bytes=index_row_bytes,
            )
            for j, layer in enumerate(self.indexer_layers)
        ]
        return tuple(kv + index)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies over all layers (KV plus index-K)."""
        return sum(u.page_bytes for u in self.units) // self.page_size
