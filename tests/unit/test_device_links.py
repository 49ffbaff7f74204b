"""On `topology.device=cpu` the cost model prices with the CPU's links, not the H200 preset
that `runtime.links` defaults to (a CPU bench's "/ estimate" column read 4x-2364x), unless the
command line names the links; and every report whose numbers come from link speeds names
the links, and what `strategy=auto` picked."""

from __future__ import annotations

import json

import pytest
from conftest import job_config

from pipeline.cli.main import COMMANDS, run_command


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_command(COMMANDS[args[0]], list(args[1:]), args[0])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_cpu_job_prices_with_the_cpu_links_and_says_why() -> None:
    job = job_config("topology.device=cpu", "strategy=auto")
    assert job.runtime.links == "cpu"  # what bench's estimates and plan read
    picked = [n for n in job.verdict.notes if n.startswith("strategy=auto picked")]
    assert len(picked) == 1 and picked[0].endswith("(links cpu)")
    (why,) = [n for n in job.verdict.notes if n.startswith("runtime.links")]
    assert why == (
        "runtime.links=cpu: topology.device=cpu, and the default h200 preset prices an H200 "
        "host (runtime.links=h200 on the command line keeps it)"
    )


def test_links_named_on_the_command_line_are_kept_on_cpu() -> None:
    job = job_config("topology.device=cpu", "runtime.links=h200", "strategy=auto")
    assert job.runtime.links == "h200"
    assert not any(n.startswith("runtime.links") for n in job.verdict.notes)
    assert job_config("topology.device=auto").runtime.links == "h200"  # unknown: the default


def test_explain_and_plan_on_cpu_name_the_cpu_links_and_autos_pick(
    capsys: pytest.CaptureFixture,
) -> None:
    code, out, err = in_process(capsys, "explain", "strategy=auto", "topology.device=cpu", "--json")
    assert code == 0, err
    said = json.loads(out)
    assert said["estimates"]["links"] == "cpu" and said["auto"] is True
    assert any(n.startswith("runtime.links=cpu: topology.device=cpu") for n in said["notes"])
    code, out, err = in_process(capsys, "plan", "strategy=auto", "topology.device=cpu")
    assert code == 0, err
    assert "estimate (links cpu):" in out and "strategy=auto picked" in out
    assert "runtime.links=cpu: topology.device=cpu" in out


def test_check_ordering_names_what_auto_picked(capsys: pytest.CaptureFixture) -> None:
    code, out, err = in_process(capsys, "check-ordering", "strategy=auto", "topology.device=cpu")
    assert code == 0, err
    assert "note: strategy=auto picked" in out and "(links cpu)" in out


def test_bench_md_names_the_links_its_estimates_used() -> None:
    from pipeline.jobs.bench.output import markdown

    result = {
        "model": "tiny_mla",
        "topology": "tp2",
        "ranks": 2,
        "device_name": "cpu",
        "floors": {
            **{f"{way}_{when}_gbps": [1.0] for way in ("h2d", "d2h") for when in ("alone", "all")},
            "broadcast_gbps": None,
        },
        "rows": [],
        "links": "cpu",
    }
    lines = markdown(result).splitlines()
    assert lines[1] == "estimates priced with the `cpu` links"
    del result["links"]  # no estimates: no links to name
    assert "links" not in markdown(result)
