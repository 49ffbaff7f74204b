"""The ordering model finds the ungated deadlock and none with either ordering design."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.jobs.deadlock_model import DESIGNS, Op, check, scenario


@pytest.mark.parametrize(
    ("layers", "ranks", "parts"), [(1, 2, 1), (5, 2, 2), (61, 8, 1), (9, 3, 3)]
)
def test_only_the_unordered_load_deadlocks(layers: int, ranks: int, parts: int) -> None:
    per_layer = [parts] * layers
    found = {d: check(scenario(d, per_layer, ranks)) for d in DESIGNS}
    assert found["none"].deadlock
    assert not found["gate"].deadlock and not found["forward_stream"].deadlock
    witness = "\n".join(found["none"].witness)
    assert "started broadcast layer 0 part 0" in witness
    assert "started all-reduce layer 0" in witness


def test_no_broadcasts_means_no_deadlock() -> None:
    assert not any(check(scenario(d, [0, 0, 0], 4)).deadlock for d in DESIGNS)


def test_collectives_issued_in_different_orders_on_one_stream_deadlock() -> None:
    """The classic: rank 0 issues A then B, rank 1 B then A, on one communicator each."""
    a, b = Op("collective", "A"), Op("collective", "B")
    program = (((a, b), ()), ((b, a), ()))
    assert check(program).deadlock


def test_a_wait_on_an_event_never_recorded_is_a_deadlock() -> None:
    program = (((), (Op("wait", "never"),)),)
    finding = check(program)
    assert finding.deadlock and finding.witness == ("rank 0 forward stream: waiting never",)


def test_unknown_design_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ordering design 'sometimes'"):
        scenario("sometimes", [1], 2)


def test_check_ordering_command() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "check-ordering",
            "strategy=rotating",
            "topology=tp4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ranks"] == 4 and result["layers"] == 5 and result["configured"] == "gate"
    assert [result["designs"][d]["deadlock"] for d in DESIGNS] == [True, False, False]


@pytest.mark.parametrize(
    ("design", "ranks", "layers"), [("forward_stream", 1024, 4096), ("gate", 16, 4096)]
)
def test_a_model_beyond_the_budget_is_refused_by_its_work_not_only_its_states(
    design: str, ranks: int, layers: int
) -> None:
    """The budget counts work (ranks times stream length per state): 16 ranks of 4096 layers
    ran over 5 minutes within 200000 states, and 1024 ranks of 4096 layers cost 40 ms a
    state; the first is now refused within its budget, the second before it starts."""
    with pytest.raises(ValueError, match=r"budget: check a smaller case|budget of"):
        check(scenario(design, [1] * layers, ranks))
