"""Topology and ModelGeometry: derived TP/DP/CP numbers, units, bytes and every config error."""

from __future__ import annotations

import pytest
from hydra import initialize_config_module

from pipeline.config.compose import Session
from pipeline.config.sources import SHIPPED
from pipeline.core.model import IndexerConfig, KvDtype, ModelGeometry, ModelKind, Unit
from pipeline.core.topology import Topology


def topo(**kw) -> Topology:
    return Topology(**{"name": "t", "tp_size": 8, **kw})


def model(**kw) -> ModelGeometry:
    base = dict(
        name="m",
        kind=ModelKind.mla,
        num_layers=4,
        kv_row_bytes=64,
        kv_dtype=KvDtype.bf16,
        page_size=4,
    )
    return ModelGeometry(**{**base, **kw})


MLA = model()
MHA = model(kind=ModelKind.mha)


# --- derived numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "attn_tp"),
    [
        ({}, 8),
        ({"dp_attention": True, "dp_size": 1}, 8),
        ({"dp_attention": True, "dp_size": 2}, 4),
        ({"dp_attention": True, "dp_size": 8}, 1),
        ({"attn_cp_size": 2}, 4),
        ({"dp_attention": True, "dp_size": 2, "attn_cp_size": 2}, 2),
    ],
)
def test_attn_tp_size(kw: dict, attn_tp: int) -> None:
    """attention-TP = tp / (dp if dp_attention) / attn_cp."""
    assert topo(**kw).attn_tp_size == attn_tp


def test_world_size_counts_pipeline_stages() -> None:
    """world_size is tp x pp."""
    assert topo(tp_size=4, pp_size=2).world_size == 8


def test_attn_group_is_contiguous_block() -> None:
    """With DP attention 2 over tp 8, ranks split into blocks of 4."""
    t = topo(dp_attention=True, dp_size=2)
    assert t.attn_group(0) == (0, 1, 2, 3)
    assert t.attn_group(5) == (4, 5, 6, 7)
    assert topo().attn_group(3) == tuple(range(8))


def test_dcp_rank_within_attention_group() -> None:
    """dcp_rank is the rank's position in its attention group modulo dcp_size."""
    assert [topo(dcp_size=4).dcp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    t = topo(dp_attention=True, dp_size=2, dcp_size=2)
    assert [t.dcp_rank(r) for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert topo().dcp_rank(5) == 0


def test_replica_group_mla_with_dcp() -> None:
    """MLA with dcp 4 on tp 8: the ranks of the same DCP shard hold the same bytes."""
    t = topo(dcp_size=4)
    assert t.replica_group(1, MLA) == (1, 5)
    assert t.replica_group(6, MLA) == (2, 6)
    assert t.replica_groups(MLA) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_replica_group_mla_without_dcp() -> None:
    """MLA: the whole attention group; DP attention gives one group per DP rank."""
    assert topo().replica_groups(MLA) == [tuple(range(8))]
    t = topo(tp_size=4, dp_attention=True, dp_size=2)
    assert t.replica_group(3, MLA) == (2, 3)
    assert t.replica_groups(MLA) == [(0, 1), (2, 3)]


def test_replica_group_mha_is_the_rank_alone() -> None:
    """MHA heads are split over ranks, so every rank is its own replica group."""
    t = topo(dcp_size=2)
    assert t.replica_group(3, MHA) == (3,)
    assert t.replica_groups(MHA) == [(r,) for r in range(8)]


# --- topology errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["tp_size", "dp_size", "attn_cp_size", "dcp_size", "pp_size", "nnodes"]
)
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_sizes_rejected(field: str, value: int) -> None:
    """Every size must be a positive integer, named with its section."""
    with pytest.raises(ValueError, match=rf"topology\.{field}={value} must be a positive integer"):
        topo(**{field: value})


def test_dp_size_needs_dp_attention() -> None:
    """dp_size > 1 without dp_attention names both ways out."""
    with pytest.raises(
        ValueError,
        match=r"dp_size=2 needs topology\.dp_attention=true \(or set topology\.dp_size=1\)",
    ):
        topo(dp_size=2)


def test_dp_must_divide_tp() -> None:
    """tp 6 cannot split into 4 DP attention groups."""
    with pytest.raises(ValueError, match=r"dp_size=4 must divide topology\.tp_size=6"):
        topo(tp_size=6, dp_attention=True, dp_size=4)


def test_attn_cp_must_divide_tp_over_dp() -> None:
    """attn_cp must divide tp / dp; the message shows that quotient."""
    with pytest.raises(ValueError, match=r"attn_cp_size=3 must divide tp_size / dp_size = 4"):
        topo(dp_attention=True, dp_size=2, attn_cp_size=3)


def test_dcp_must_divide_attention_tp() -> None:
    """dcp must divide the attention-TP size (here 8 / 2 = 4)."""
    with pytest.raises(ValueError, match=r"dcp_size=3 must divide the attention-TP size 8"):
        topo(dcp_size=3)
    with pytest.raises(ValueError, match=r"dcp_size=8 must divide the attention-TP size 4"):
        topo(dp_attention=True, dp_size=2, dcp_size=8)


def test_nnodes_must_divide_world() -> None:
    """nnodes must divide tp x pp."""
    with pytest.raises(ValueError, match=r"nnodes=3 must divide tp_size x pp_size = 8"):
        topo(tp_size=4, pp_size=2, nnodes=3)
    assert topo(tp_size=4, pp_size=2, nnodes=2).nnodes == 2


# --- model geometry --------------------------------------------------------------------------


def test_units_kv_then_index() -> None:
    """KV layers get ordinals 0..L-1; index-K layer j gets L + j, one row of page x row_bytes."""
    m = model(
        num_layers=5,
        kv_row_bytes=48,
        kv_dtype=KvDtype.fp8,
        indexer=IndexerConfig(row_bytes=16, layers=[1, 3]),
    )
    kv = [Unit(i, i, "kv", 4, 48) for i in range(5)]
    index = [Unit(5, 1, "index", 1, 64), Unit(6, 3, "index", 1, 64)]
    assert m.units == tuple(kv + index)
    assert [u.page_bytes for u in m.units] == [192] * 5 + [64, 64]
    assert m.bytes_per_token == 5 * 48 + 2 * 16


def test_indexer_layers_null_means_every_layer() -> None:
    """indexer.layers=None puts an index-K unit on every layer, after all KV units."""
    m = model(num_layers=3, indexer=IndexerConfig(row_bytes=8))
    assert m.indexer_layers == (0, 1, 2)
    assert [(u.ordinal, u.layer, u.pool) for u in m.units[3:]] == [
        (3, 0, "index"),
        (4, 1, "index"),
        (5, 2, "index"),
    ]
    assert model().indexer_layers == ()


@pytest.mark.parametrize(
    ("preset", "bytes_per_token"),
    [
        ("deepseek_v3", 70272),
        ("deepseek_v3_fp8", 35136),
        ("deepseek_v32", 48068),
        ("glm5", 47700),
        ("tiny_mla", 320),
        ("tiny_dsa", 272),
    ],
)
def test_shipped_preset_bytes_per_token(preset: str, bytes_per_token: int) -> None:
    """The composed presets match the byte counts documented in their YAML comments."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        m = Session.compose([f"model={preset}"]).model()
    assert m.name == preset
    assert m.bytes_per_token == bytes_per_token


def test_kv_row_bytes_must_be_whole_elements() -> None:
    """63 B is not a whole number of bf16 elements; the message says to use a multiple of 2."""
    with pytest.raises(
        ValueError, match=r"kv_row_bytes=63 is not a whole number of bf16 elements.*multiple of 2"
    ):
        model(kv_row_bytes=63)
    assert model(kv_row_bytes=63, kv_dtype=KvDtype.fp8).kv_row_bytes == 63


@pytest.mark.parametrize("field", ["num_layers", "kv_row_bytes", "page_size"])
def test_model_non_positive_rejected(field: str) -> None:
    """Model sizes must be positive integers."""
    with pytest.raises(ValueError, match=rf"model\.{field}=0 must be a positive integer"):
        model(**{field: 0})


def test_indexer_row_bytes_must_be_positive() -> None:
    """indexer.row_bytes is checked like the other sizes."""
    with pytest.raises(ValueError, match=r"model\.indexer\.row_bytes=0 must be a positive"):
        model(indexer=IndexerConfig(row_bytes=0))


def test_indexer_layers_out_of_range() -> None:
    """Layers outside 0..L-1 are listed in the error."""
    with pytest.raises(ValueError, match=r"layers \[4, -1\] lie outside 0\.\.3"):
        model(indexer=IndexerConfig(row_bytes=8, layers=[0, 4, -1]))


@pytest.mark.parametrize("layers", [[2, 1], [1, 1, 2]])
def test_indexer_layers_unsorted_or_repeated(layers: list[int]) -> None:
    """Index-K layers must be strictly increasing."""
    with pytest.raises(ValueError, match="must be increasing with no repeats"):
        model(indexer=IndexerConfig(row_bytes=8, layers=layers))


def test_glm5_index_k_layers_are_the_models_own() -> None:
    """GLM-5 keeps index-K on layer 0, then every 4th layer from layer 1: 21 of 78."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        glm5 = Session.compose(["model=glm5"]).model()
    assert glm5.indexer_layers == (0, *range(1, 78, 4))
    assert len(glm5.indexer_layers) == 21 and glm5.indexer_layers[-1] == 77
