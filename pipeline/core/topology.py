"""The deployment's parallel layout: all TP/DP/CP arithmetic, no process groups.

`Topology` is both the typed schema of the `topology` config group and the plain object the
rest of the code reads (its `__post_init__` cross-field checks run wherever it is built).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pipeline.core.checks import Problem, positive, raise_problems
from pipeline.core.model import ModelGeometry, ModelKind

MAX_RANKS = 1024
"""Most ranks a topology may have: reports and checks walk every rank, and a config from a
stranger must not make them walk a million."""


class IoBackend(Enum):
    """How pages move between host and device: DMA copies or gather/scatter kernels."""

    direct = "direct"
    kernel = "kernel"


class MemLayout(Enum):
    """How the host pool orders a page's units and rows (auto: resolved by
    `pipeline.config.layouts.normalize`)."""

    auto = "auto"
    layer_first = "layer_first"
    page_first = "page_first"
    page_first_direct = "page_first_direct"


POOL_LAYOUTS = (MemLayout.layer_first, MemLayout.page_first, MemLayout.page_first_direct)
"""The layouts a host pool takes (auto resolves to one of them)."""


class DisaggregationMode(Enum):
    """Prefill/decode disaggregation role of a server."""

    none = "none"
    prefill = "prefill"
    decode = "decode"


class DeviceKind(Enum):
    """Where device pools live."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Backend(Enum):
    """Process-group backend: auto picks nccl on cuda, gloo on cpu."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


@dataclass(kw_only=True)
class Topology:
    """Parallel degrees, cache backends and device of one deployment."""

    name: str
    """Preset name, shown in reports."""
    tp_size: int
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
    """Host pool layout: layer_first, page_first (token-major), page_first_direct (page-major),
    or auto: page_first_direct with io_backend direct (a page's layer is one block on both
    sides, an L3 object one run of the pool), whatever io_backend says."""
    disaggregation_mode: DisaggregationMode = DisaggregationMode.none
    """Prefill/decode disaggregation role of this server."""
    device: DeviceKind = DeviceKind.auto
    """Where device pools live: auto picks cuda when available, else cpu."""

    @property
    def shape(self) -> str:
        """What the topology is, whatever its preset was called: e.g. 'tp8 dp2'."""
        sizes = (
            (self.dp_size, "dp"),
            (self.attn_cp_size, "cp"),
            (self.dcp_size, "dcp"),
            (self.pp_size, "pp"),
        )
        parts = [f"tp{self.tp_size}", *(f"{tag}{n}" for n, tag in sizes if n > 1)]
        return " ".join(parts + ([f"on {self.nnodes} nodes"] if self.nnodes > 1 else []))

    @property
    def label(self) -> str:
        """How reports name it: its shape, and the preset's name where that says otherwise."""
        return self.shape if self.shape == self.name else f"{self.shape} (preset {self.name})"

    def __post_init__(self) -> None:
        sizes = ("tp_size", "dp_size", "attn_cp_size", "dcp_size", "pp_size", "nnodes")
        found = positive("topology", self, *sizes)  # the rules below divide by them
        if not found and self.world_size > MAX_RANKS:
            found.append(
                Problem(
                    "topology.tp_size",
                    f"topology.tp_size x pp_size = {self.world_size}: at most {MAX_RANKS} ranks",
                )
            )
        raise_problems(found)
        raise_problems(self._layout_problems())

    def _layout_problems(self) -> list[Problem]:
        """Cross-field rules, each checked once the ones it rests on hold."""
        found = []
        if self.dp_size > 1 and not self.dp_attention:
            found.append(
                Problem(
                    "topology.dp_size",
                    f"topology.dp_size={self.dp_size} needs topology.dp_attention=true "
                    "(or set topology.dp_size=1)",
                )
            )
        if self.tp_size % self.attn_dp_size:
            found.append(
                Problem(
                    "topology.dp_size",
                    f"topology.dp_size={self.dp_size} must divide topology.tp_size={self.tp_size}",
                )
            )
        elif (self.tp_size // self.attn_dp_size) % self.attn_cp_size:
            found.append(
                Problem(
                    "topology.attn_cp_size",
                    f"topology.attn_cp_size={self.attn_cp_size} must divide tp_size / dp_size = "
                    f"{self.tp_size // self.attn_dp_size}",
                )
            )
        elif self.attn_tp_size % self.dcp_size:
            found.append(
                Problem(
                    "topology.dcp_size",
                    f"topology.dcp_size={self.dcp_size} must divide the attention-TP size "
                    f"{self.attn_tp_size}",
                )
            )
        if self.world_size % self.nnodes:
            found.append(
                Problem(
                    "topology.nnodes",
                    f"topology.nnodes={self.nnodes} must divide tp_size x pp_size = "
                    f"{self.world_size}",
                )
            )
        return found

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
