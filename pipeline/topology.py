"""The model's geometry and the deployment's parallel layout: all TP/DP/CP arithmetic, no groups.

`ModelGeometry` and `Topology` are both the typed schemas of their config groups and the plain
objects the rest of the code uses (`OmegaConf.to_object` builds them and runs `__post_init__`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from omegaconf import MISSING


class ModelKind(Enum):
    mla = "mla"
    mha = "mha"


class KvDtype(Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp4 = "fp4"

    @property
    def itemsize(self) -> int:
        """Bytes per stored element (fp8 and fp4 are stored as packed uint8)."""
        return 2 if self in (KvDtype.bf16, KvDtype.fp16) else 1


class IoBackend(Enum):
    direct = "direct"
    kernel = "kernel"


class MemLayout(Enum):
    layer_first = "layer_first"
    page_first = "page_first"
    page_first_direct = "page_first_direct"


class StorageBackend(Enum):
    none = "none"
    file = "file"
    mooncake = "mooncake"
    hf3fs = "hf3fs"
    nixl = "nixl"


class DisaggregationMode(Enum):
    none = "none"
    prefill = "prefill"
    decode = "decode"


class DeviceKind(Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


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


@dataclass
class IndexerConfig:
    row_bytes: int = MISSING
    """Bytes of DSA index-K per token per indexer layer (stored one page per row)."""
    layers: list[int] | None = None
    """Model layers that carry an index-K buffer; null means every layer."""


@dataclass
class ModelGeometry:
    name: str = MISSING
    """Preset name, shown in reports."""
    kind: ModelKind = MISSING
    """mla: one latent KV that every TP rank holds whole; mha: KV heads split over TP ranks."""
    num_layers: int = MISSING
    """Attention layers whose KV the cache holds."""
    kv_row_bytes: int = MISSING
    """Bytes per token per layer of the KV pool."""
    kv_dtype: KvDtype = MISSING
    """Element type of the KV pool; fp8 and fp4 are stored as uint8."""
    page_size: int = MISSING
    """Tokens per page; every transfer moves whole pages."""
    indexer: IndexerConfig | None = None
    """DSA index-K pool; null for models without one."""

    def __post_init__(self) -> None:
        _require_positive("model", self, "num_layers", "kv_row_bytes", "page_size")
        if self.kv_row_bytes % self.kv_dtype.itemsize:
            raise ValueError(
                f"model.kv_row_bytes={self.kv_row_bytes} is not a whole number of "
                f"{self.kv_dtype.value} elements ({self.kv_dtype.itemsize} B): use a multiple of "
                f"{self.kv_dtype.itemsize}"
            )
        if self.indexer is None:
            return
        _require_positive("model.indexer", self.indexer, "row_bytes")
        layers = self.indexer_layers
        bad = [x for x in layers if not 0 <= x < self.num_layers]
        if bad:
            raise ValueError(
                f"model.indexer.layers {bad} lie outside 0..{self.num_layers - 1}: "
                f"list layers of this {self.num_layers}-layer model"
            )
        if list(layers) != sorted(set(layers)):
            raise ValueError("model.indexer.layers must be increasing with no repeats")

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


@dataclass
class Topology:
    name: str = MISSING
    """Preset name, shown in reports."""
    tp_size: int = MISSING
    """Tensor-parallel ranks of one pipeline stage."""
    dp_attention: bool = False
    """Data-parallel attention: attention runs on tp_size / dp_size ranks per group."""
    dp_size: int = 1
    """Attention data-parallel groups (needs dp_attention when > 1)."""
    attn_cp_size: int = 1
    """Attention context-parallel size (splits the tokens of a request over ranks)."""
    dcp_size: int = 1
    """Decode context parallel: logical slot s lives on rank s % dcp_size at row s // dcp_size."""
    pp_size: int = 1
    """Pipeline-parallel stages."""
    nnodes: int = 1
    """Nodes the deployment spans."""
    io_backend: IoBackend = IoBackend.kernel
    """direct: one copy per contiguous run of pages; kernel: one gather/scatter op per layer."""
    mem_layout: MemLayout = MemLayout.layer_first
    """Host pool layout: layer_first, page_first (token-major) or page_first_direct (page-major)."""
    storage_backend: StorageBackend = StorageBackend.none
    """L3 store behind the host pool."""
    disaggregation_mode: DisaggregationMode = DisaggregationMode.none
    """Prefill/decode disaggregation role of this server."""
    device: DeviceKind = DeviceKind.auto
    """Where device pools live: auto picks cuda when available, else cpu."""

    def __post_init__(self) -> None:
        _require_positive(
            "topology", self, "tp_size", "dp_size", "attn_cp_size", "dcp_size", "pp_size", "nnodes"
        )
        if self.dp_size > 1 and not self.dp_attention:
            raise ValueError(
                f"topology.dp_size={self.dp_size} needs topology.dp_attention=true "
                "(or set topology.dp_size=1)"
            )
        if self.tp_size % self.attn_dp_size:
            raise ValueError(
                f"topology.dp_size={self.dp_size} must divide topology.tp_size={self.tp_size}"
            )
        if (self.tp_size // self.attn_dp_size) % self.attn_cp_size:
            raise ValueError(
                f"topology.attn_cp_size={self.attn_cp_size} must divide tp_size / dp_size = "
                f"{self.tp_size // self.attn_dp_size}"
            )
        if self.attn_tp_size % self.dcp_size:
            raise ValueError(
                f"topology.dcp_size={self.dcp_size} must divide the attention-TP size "
                f"{self.attn_tp_size}"
            )
        if self.world_size % self.nnodes:
            raise ValueError(
                f"topology.nnodes={self.nnodes} must divide tp_size x pp_size = {self.world_size}"
            )

    @property
    def attn_dp_size(self) -> int:
        return self.dp_size if self.dp_attention else 1

    @property
    def attn_tp_size(self) -> int:
        """Ranks that run one attention group (tp, or tp / dp with DP attention, / attn CP)."""
        return self.tp_size // (self.attn_dp_size * self.attn_cp_size)

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def attn_group(self, rank: int) -> tuple[int, ...]:
        """The TP ranks of `rank`'s attention group (contiguous blocks of attn_tp_size)."""
        first = rank - rank % self.attn_tp_size
        return tuple(range(first, first + self.attn_tp_size))

    def dcp_rank(self, rank: int) -> int:
        return (rank % self.attn_tp_size) % self.dcp_size

    def replica_group(self, rank: int, model: ModelGeometry) -> tuple[int, ...]:
        """Ranks that hold the same KV bytes as `rank`.

        MLA: the attention group's ranks that own the same DCP shard. MHA: only `rank` (heads
        are split), so no strategy can share its bytes.
        """
        if model.kind is ModelKind.mha:
            return (rank,)
        dcp = self.dcp_size
        return tuple(r for r in self.attn_group(rank) if r % dcp == rank % dcp)

    def replica_groups(self, model: ModelGeometry) -> list[tuple[int, ...]]:
        """Every replica group of one pipeline stage, in rank order of their first member."""
        groups: dict[tuple[int, ...], None] = {}
        for rank in range(self.tp_size):
            groups.setdefault(self.replica_group(rank, model))
        return list(groups)


def _require_positive(section: str, obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{section}.{name}={value!r} must be a positive integer")
