"""`explain` answers for any config that composes: one JSON verdict with the effective strategy
(or none), every rule of the requested strategy and of each fallback tried, and every problem a
run would refuse; exit 2 only for a config that does not compose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli.commands import explain
from pipeline.cli.invocation import Invocation
from pipeline.cli.main import run_command
from pipeline.config.app import CommandLine, configs
from pipeline.config.deployment import Configs

CONF = Path(__file__).resolve().parents[2] / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.fixture
def sources() -> Iterator[Configs]:
    """One Hydra initialization for a test's cases (each composes in this process)."""
    with configs(None) as loaded:
        yield loaded


def explained(sources: Configs, capsys: pytest.CaptureFixture, *overrides: str) -> dict:
    line = CommandLine(as_json=True, overrides=list(overrides))
    code = explain(Invocation(line, sources))
    out = capsys.readouterr().out
    assert code == 0, (overrides, out)
    return json.loads(out)


FULL = ("tp1", "tp8", "two_nodes_tp16")
"""Topologies checked with every strategy x store here; the others with each strategy and
one store, the stores taking turns (every pair is covered), the rest of their grid with -m
slow: each case composes the config once per strategy."""


@pytest.mark.parametrize("topology", options("topology"))
def test_every_topology_strategy_and_store_of_conf_gets_a_json_verdict(
    topology: str, sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    """Each topology a case of its own, so that the test workers share them out."""
    stores = options("storage")
    cases = [
        (topology, strategy, store)
        for i, strategy in enumerate(options("strategy"))
        for j, store in enumerate(stores)
        if topology in FULL or (i + options("topology").index(topology)) % len(stores) == j
    ]
    assert {strategy for _, strategy, _ in cases} == set(options("strategy"))
    assert len(cases) == (12 if topology in FULL else 4)
    check_verdicts(topology, cases, sources, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("topology", [t for t in options("topology") if t not in FULL])
def test_every_strategy_and_store_of_the_other_topologies_gets_a_json_verdict(
    topology: str, sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    cases = [(topology, s, store) for s in options("strategy") for store in options("storage")]
    assert len(cases) == 12
    check_verdicts(topology, cases, sources, capsys)


def check_verdicts(
    topology: str, cases: list[tuple[str, str, str]], sources: Configs, capsys
) -> None:
    strategies = options("strategy")
    dead_ends = []
    for topology, strategy, store in cases:
        case = (f"topology={topology}", f"strategy={strategy}", f"storage={store}")
        verdict = explained(sources, capsys, *case)
        if strategy == "auto":  # the winner's verdict, said to be auto's pick
            assert verdict["auto"] and verdict["strategy"] == verdict["estimates"]["winner"], case
            assert verdict["active"], case
        else:
            assert verdict["strategy"] == strategy and not verdict["auto"], case
        estimated = {e["strategy"] for e in verdict["estimates"]["strategies"]}
        assert estimated == set(strategies) - {"auto"}, case
        chain = [verdict, *verdict["fallbacks"]]
        for tried in chain:
            assert tried["active"] == all(r["passed"] for r in tried["rules"]), case
            for rule in tried["rules"]:
                assert set(rule) == {"name", "passed", "message"} and rule["message"], case
        effective = verdict["effective_strategy"]
        if effective is None:  # the chain ends at an inactive strategy: why, and its fix
            dead_ends.append(case)
            assert not any(t["active"] for t in chain), case
            assert any(p["key"] == "strategy.fallback" for p in verdict["problems"]), case
            assert not verdict["runs"], case
        else:
            assert effective in strategies and chain[-1]["active"], case
            assert [t["strategy"] for t in chain][-1] == effective, case
    # storage=file on two nodes: replicated's readers never see the other node's objects
    if topology == "two_nodes_tp16":
        assert ("topology=two_nodes_tp16", "strategy=replicated", "storage=file") in dead_ends
        assert ("topology=two_nodes_tp16", "strategy=rotating", "storage=file") in dead_ends
    assert all("storage=file" in case for case in dead_ends), dead_ends


def test_a_config_no_strategy_runs_for_says_every_fix_with_its_other_problems(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    verdict = explained(
        sources,
        capsys,
        "strategy=replicated",
        "storage=file",
        "topology.nnodes=2",
        "workload.num_tokens=33",
    )
    assert verdict["effective_strategy"] is None and verdict["fallbacks"] == []
    assert [(r["name"], r["passed"]) for r in verdict["rules"]] == [("readers_reach_store", False)]
    assert "use storage=mooncake" in verdict["rules"][0]["message"]
    problems = {p["key"]: p for p in verdict["problems"]}
    assert set(problems) == {"strategy.fallback", "workload.num_tokens"}
    assert problems["workload.num_tokens"]["file"] == "overrides"
    assert (
        "must be a multiple of page_size x dcp_size = 4"
        in problems["workload.num_tokens"]["message"]
    )
    assert problems["strategy.fallback"]["file"].endswith("strategy/replicated.yaml")


def test_a_dead_end_fallback_shows_the_rules_of_every_strategy_tried(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    verdict = explained(
        sources, capsys, "topology=two_nodes_tp16", "strategy=rotating", "storage=file"
    )
    failed = {r["name"] for r in verdict["rules"] if not r["passed"]}
    assert failed == {"single_node", "layers_ge_group"}
    assert verdict["notes"] == [
        "rotating is inactive: falling back to replicated",
    ]
    [fallback] = verdict["fallbacks"]
    assert fallback["strategy"] == "replicated" and fallback["active"] is False
    assert [r["name"] for r in fallback["rules"] if not r["passed"]] == ["readers_reach_store"]


def test_an_active_strategy_runs_and_a_fallback_is_listed_active(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    verdict = explained(sources, capsys, "strategy=rotating", "topology=tp1")
    assert verdict["effective_strategy"] == "replicated" and verdict["runs"]
    assert verdict["fallbacks"][0]["strategy"] == "replicated"
    assert verdict["fallbacks"][0]["active"] and verdict["problems"] == []


def test_the_text_says_none_and_each_inactive_fallback(capsys: pytest.CaptureFixture) -> None:
    args = ["topology=two_nodes_tp16", "strategy=rotating", "storage=file"]
    assert run_command(explain, args, "explain") == 0
    out = capsys.readouterr().out
    assert "effective strategy: none" in out
    assert "fallback replicated: INACTIVE\n  FAIL readers_reach_store" in out
    assert "problems (run refuses this config until each is fixed):" in out


def test_strict_exits_1_and_a_config_that_does_not_compose_exits_2(
    capsys: pytest.CaptureFixture,
) -> None:
    args = ["topology=two_nodes_tp16", "strategy=rotating", "storage=file", "strict=true"]
    assert run_command(explain, [*args, "--json"], "explain") == 1
    assert json.loads(capsys.readouterr().out)["effective_strategy"] is None
    assert run_command(explain, ["strategy=rotatingg", "--json"], "explain") == 2
    said = json.loads(capsys.readouterr().out)
    assert said["exit_code"] == 2 and "did you mean rotating?" in said["error"]
    assert run_command(explain, ["topology.tp_size=0", "--json"], "explain") == 2
    assert "topology.tp_size" in json.loads(capsys.readouterr().out)["error"]


DEEPSEEK_16K = ["model=deepseek_v3", "workload.num_tokens=16384", "workload.device_tokens=65536"]


def text_of(sources: Configs, capsys: pytest.CaptureFixture, *overrides: str) -> str:
    assert explain(Invocation(CommandLine(overrides=list(overrides)), sources)) == 0
    return capsys.readouterr().out


def test_auto_explains_every_strategys_estimate_and_the_winner_in_json_and_text(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    verdict = explained(sources, capsys, "strategy=auto", "topology=tp2", *DEEPSEEK_16K)
    assert verdict["auto"] and verdict["strategy"] == "rotating" and verdict["runs"]
    estimates = verdict["estimates"]
    assert estimates["winner"] == "rotating" and estimates["links"] == "h200"
    by_name = {e["strategy"]: e for e in estimates["strategies"]}
    assert set(by_name) == {"replicated", "single_source", "rotating"}
    for e in by_name.values():
        assert e["backup"]["ms"] > 0 and e["load"]["bound"] and e["l3_load"] is None
        terms = e["load"]["terms_ms"]  # an overlapped term runs beside the others
        serial = sum(ms for name, ms in terms.items() if "(overlapped)" not in name)
        assert serial == pytest.approx(e["load"]["ms"], abs=0.01)
    assert (
        by_name["rotating"]["host_link_bytes_per_rank"] * 2
        < by_name["replicated"]["host_link_bytes_per_rank"] * 1.1
    )
    assert verdict["notes"][-1].startswith("strategy=auto picked rotating: estimated load-back")
    assert verdict["warnings"] == []
    out = text_of(sources, capsys, "strategy=auto", "topology=tp2", *DEEPSEEK_16K)
    assert "strategy rotating: ACTIVE" in out and "estimates (links h200; 16384 tokens" in out
    assert "winner: rotating (picked by strategy=auto)" in out


def test_a_dedup_strategy_expected_to_lose_is_warned_with_what_to_change(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    args = ("strategy=single_source", "topology=two_nodes_tp16", *DEEPSEEK_16K)
    verdict = explained(sources, capsys, *args)
    assert verdict["strategy"] == verdict["effective_strategy"] == "single_source"
    assert not verdict["auto"] and verdict["estimates"]["winner"] == "replicated"
    (warning,) = verdict["warnings"]
    assert warning["name"] == "dedup_expected_to_win" and not warning["passed"]
    assert "the group spans nodes" in warning["message"]
    assert "use strategy=replicated or strategy=auto" in warning["message"]
    out = text_of(sources, capsys, *args)
    assert "WARN dedup_expected_to_win: single_source is expected to lose" in out


def test_no_estimate_where_a_group_it_reads_has_a_mistake_and_auto_then_refuses(
    sources: Configs, capsys: pytest.CaptureFixture
) -> None:
    verdict = explained(sources, capsys, "strategy=auto", "workload.num_tokens=0")
    assert verdict["estimates"] is None and not verdict["runs"]
    assert any(p["key"] == "workload.num_tokens" for p in verdict["problems"])
    said = explained(sources, capsys, "runtime.links=nosuch")
    assert said["estimates"] is None
    assert [p["key"] for p in said["problems"]] == ["runtime.links"]


def test_a_users_own_strategy_option_is_priced_beside_the_shipped_ones(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "prod.yaml").write_text(
        "defaults: [rotating, _self_]\nname: prod\nchunk_pages: 16\n"
    )
    (tmp_path / "strategy" / "norules.yaml").write_text(
        "defaults: [replicated, _self_]\nname: norules\nrequires: [no_such_rule]\n"
    )
    line = CommandLine(as_json=True, overrides=["strategy=prod", "topology=tp4"])
    with configs(str(tmp_path)) as mine:
        assert explain(Invocation(line, mine)) == 0
    said = json.loads(capsys.readouterr().out)
    by_name = {e["strategy"]: e for e in said["estimates"]["strategies"]}
    assert list(by_name) == ["replicated", "rotating", "single_source", "prod"]
    assert by_name["prod"]["active"] and by_name["prod"]["load"] == by_name["rotating"]["load"]
    line = CommandLine(overrides=["strategy=prod", "topology=tp4"])
    with configs(str(tmp_path)) as mine:
        assert explain(Invocation(line, mine)) == 0
    assert "\n  prod           yes " in capsys.readouterr().out
