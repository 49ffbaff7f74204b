"""Eligibility: the shipped strategies' rules, the verdict, fallbacks and normalizations."""

from __future__ import annotations

import pytest
from hydra import initialize_config_module

from pipeline.config.compose import Session
from pipeline.config.eligibility import RULES, Verdict, decide, evaluate
from pipeline.config.layouts import normalize
from pipeline.config.sources import SHIPPED
from pipeline.core.model import KvDtype, ModelGeometry, ModelKind
from pipeline.core.ownership import Ownership
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.core.topology import IoBackend, MemLayout, Topology

ROTATING = [
    "attn_tp_gt_1",
    "no_attn_cp",
    "no_dcp",
    "single_pp_stage",
    "single_node",
    "mem_layout_supported",
    "not_pd_decode",
    "mla_pool",
    "mla_not_fp4",
    "layers_ge_group",
]
SINGLE_SOURCE = ["mla_pool", "mla_not_fp4", "attn_tp_gt_1"]

NO_STORE = StorageConfig()
MLA = ModelGeometry(
    name="m", kind=ModelKind.mla, num_layers=4, kv_row_bytes=64, kv_dtype=KvDtype.bf16, page_size=4
)


def verdict(*overrides: str) -> tuple[Session, Verdict]:
    """Compose the shipped config with overrides and decide (fallbacks compose too)."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        session = Session.compose(list(overrides))
        return session, session.verdict()


def failed(v: Verdict) -> list[str]:
    return [r.name for r in v.rules if not r.passed]


def lookup_from(table: dict[str, tuple[list[str], str | None]]):
    return lambda name: table[name]


@pytest.mark.parametrize(
    ("option", "rules"), [("rotating", ROTATING), ("single_source", SINGLE_SOURCE)]
)
def test_shipped_rule_lists(option: str, rules: list[str]) -> None:
    """The YAML requires lists are exactly these, and the verdict evaluates each in order."""
    session, v = verdict(f"strategy={option}", "topology=tp4")
    assert list(session.cfg.strategy.requires) == rules
    assert [r.name for r in v.rules] == rules
    assert set(rules) <= set(RULES)
    assert v.active and v.effective_strategy == option


def test_every_failing_rule_is_reported() -> None:
    """A PD decode server with 8 ranks over 5 layers on two nodes fails three rules at once."""
    _, v = verdict("strategy=rotating", "topology=pd_decode_tp8", "topology.nnodes=2")
    assert failed(v) == ["single_node", "not_pd_decode", "layers_ge_group"]
    assert not v.active
    assert v.effective_strategy == "replicated"
    assert v.notes == ("rotating is inactive: falling back to replicated",)


def test_many_failures_from_decide() -> None:
    """decide() keeps evaluating after the first failure."""
    t = Topology(name="t", tp_size=8, attn_cp_size=2, dcp_size=2, pp_size=2, nnodes=2)
    lookup = lookup_from({"rotating": (ROTATING, "replicated"), "replicated": ([], None)})
    v = decide("rotating", t, MLA, NO_STORE, lookup)
    assert failed(v) == ["no_attn_cp", "no_dcp", "single_pp_stage", "single_node"]
    by_name = {r.name: r.message for r in v.rules}
    assert "set attn_cp_size=1" in by_name["no_attn_cp"]
    assert "set dcp_size=1" in by_name["no_dcp"]
    assert "set nnodes=1 or use single_source" in by_name["single_node"]


def test_effective_config_runs_the_fallback() -> None:
    """tp 1 has no peer: rotating falls back, and the effective config is replicated's."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        job = Session.compose(["strategy=rotating", "topology=tp1"]).job()
    v = job.verdict
    assert failed(v) == ["attn_tp_gt_1"]
    assert "raise topology.tp_size" in v.rules[0].message
    assert (v.strategy, v.active, v.effective_strategy) == ("rotating", False, "replicated")
    assert job.strategy.config.name == "replicated"
    assert job.strategy.config.ownership is Ownership.replicated


def test_mha_model_makes_single_source_inactive() -> None:
    """An MHA pool fails mla_pool with a message naming the fix."""
    _, v = verdict("strategy=single_source", "model=tiny_mha")
    assert failed(v) == ["mla_pool"]
    assert "use an MLA model" in v.rules[0].message
    assert v.effective_strategy == "replicated"


def test_fallback_chain_is_followed_to_the_first_active() -> None:
    """a -> b -> c: each inactive hop leaves a note; the verdict keeps a's rules."""
    t = Topology(name="t", tp_size=1)
    lookup = lookup_from(
        {
            "a": (["attn_tp_gt_1", "no_dcp"], "b"),
            "b": (["attn_tp_gt_1"], "c"),
            "c": (["no_dcp"], None),
        }
    )
    v = decide("a", t, MLA, NO_STORE, lookup)
    assert v.effective_strategy == "c"
    assert [r.name for r in v.rules] == ["attn_tp_gt_1", "no_dcp"]
    assert v.notes == ("a is inactive: falling back to b", "b is inactive: falling back to c")
    assert v.as_dict()["rules"][0] == {
        "name": "attn_tp_gt_1",
        "passed": False,
        "message": v.rules[0].message,
    }


def test_fallback_cycle_raises() -> None:
    """a -> b -> a with both inactive is an error naming the cycle."""
    t = Topology(name="t", tp_size=1)
    lookup = lookup_from({"a": (["attn_tp_gt_1"], "b"), "b": (["attn_tp_gt_1"], "a")})
    with pytest.raises(ValueError, match=r"fallback cycle: a -> b -> a"):
        decide("a", t, MLA, NO_STORE, lookup)


def test_missing_fallback_raises() -> None:
    """An inactive strategy without a fallback cannot be decided."""
    t = Topology(name="t", tp_size=1)
    with pytest.raises(ValueError, match=r"strategy 'a' is inactive and names no fallback"):
        decide("a", t, MLA, NO_STORE, lookup_from({"a": (["attn_tp_gt_1"], None)}))


def test_unknown_rule_raises() -> None:
    """Unknown rule names are refused, listing the known ones."""
    with pytest.raises(ValueError, match=r"unknown eligibility rules \['nope'\]; known rules"):
        evaluate(["mla_pool", "nope"], Topology(name="t", tp_size=2), MLA, NO_STORE)


def test_normalize_page_first_direct_with_kernel() -> None:
    """page_first_direct + kernel -> direct, with a note."""
    t = Topology(name="t", tp_size=2, mem_layout=MemLayout.page_first_direct)
    n, notes = normalize(t)
    assert (n.io_backend, n.mem_layout) == (IoBackend.direct, MemLayout.page_first_direct)
    assert notes == ("io_backend kernel -> direct: page_first_direct pages are copied directly",)
    assert t.io_backend is IoBackend.kernel  # the input is not mutated


def test_normalize_page_first_with_direct() -> None:
    """page_first + direct -> page_first_direct, with a note."""
    t = Topology(name="t", tp_size=2, mem_layout=MemLayout.page_first, io_backend=IoBackend.direct)
    n, notes = normalize(t)
    assert (n.io_backend, n.mem_layout) == (IoBackend.direct, MemLayout.page_first_direct)
    assert len(notes) == 1 and notes[0].startswith("mem_layout page_first -> page_first_direct")


def test_normalize_leaves_other_combinations() -> None:
    """layer_first + direct and page_first + kernel pass through without notes."""
    for layout, io in [
        (MemLayout.layer_first, IoBackend.direct),
        (MemLayout.page_first, IoBackend.kernel),
    ]:
        t = Topology(name="t", tp_size=2, mem_layout=layout, io_backend=io)
        assert normalize(t) == (t, ())


@pytest.mark.parametrize("io", list(IoBackend))
def test_an_auto_layout_is_chosen_for_the_job_and_said(io: IoBackend) -> None:
    """auto: page_first_direct and the direct backend whatever the io backend named, unsaid
    (what auto means)."""
    t = Topology(name="t", tp_size=2, mem_layout=MemLayout.auto, io_backend=io)
    n, notes = normalize(t)
    assert (n.mem_layout, n.io_backend) == (MemLayout.page_first_direct, IoBackend.direct)
    assert notes == ()


@pytest.mark.parametrize("store", list(StorageKind))
def test_the_shipped_presets_choose_their_layout_per_job(store: StorageKind) -> None:
    """tp1, with or without a store: the page-major pool and the direct backend; a layout
    named on the command line is kept, with the preset's kernels."""
    for override, layout, io in (
        ((), MemLayout.page_first_direct, IoBackend.direct),
        (("topology.mem_layout=page_first",), MemLayout.page_first, IoBackend.kernel),
    ):
        session, v = verdict("topology=tp1", f"storage={store.value}", *override)
        with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
            topology = session.job().topology
        assert (topology.mem_layout, topology.io_backend) == (layout, io)
        assert v.notes == ()


def test_verdict_applies_normalization() -> None:
    """page_first + direct is normalized before mem_layout_supported runs; layer_first is not."""
    _, v = verdict(
        "strategy=rotating", "topology.io_backend=direct", "topology.mem_layout=page_first"
    )
    assert v.active
    assert any("page_first -> page_first_direct" in n for n in v.notes)
    _, v = verdict(
        "strategy=rotating", "topology.io_backend=direct", "topology.mem_layout=layer_first"
    )
    assert failed(v) == ["mem_layout_supported"]
    rules = {r.name: r.message for r in v.rules}
    assert "set topology.mem_layout=page_first_direct" in rules["mem_layout_supported"]


def test_dp_attention_keeps_rotating_with_attention_tp_2() -> None:
    """tp 4 dp 2: attention groups of 2 ranks, so rotating stays active."""
    session, v = verdict("strategy=rotating", "topology=tp4_dp2")
    assert session.topology().attn_tp_size == 2
    assert v.active and failed(v) == [] and v.notes == ()


def test_dp_attention_4_makes_rotating_inactive() -> None:
    """tp 4 dp 4: attention-TP 1, no peer holds the same bytes."""
    session, v = verdict("strategy=rotating", "topology=tp4_dp2", "topology.dp_size=4")
    assert session.topology().attn_tp_size == 1
    assert failed(v) == ["attn_tp_gt_1"]
    assert v.effective_strategy == "replicated"
