"""runtime.links: a preset or a links file, read as untrusted input before any rank starts
(every problem naming the key and the file), and `bench bench=links` on CPU writing a file
that runtime.links reads back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import job_config

from pipeline.config.links import links_of, presets
from pipeline.config.schema import RuntimeConfig
from pipeline.core.checks import ConfigError
from pipeline.core.cost import Links

H200 = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf/links/h200.yaml").read_text())


def refused(value: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        job_config(f"runtime.links={value}")
    return [f"{p.key}: {p}" for p in raised.value.problems]


def written(tmp_path: Path, data: dict, name: str = "links.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_preset_reads_and_the_knob_is_checked_where_it_lives() -> None:
    assert presets() == ["cpu", "h200"]
    assert all(isinstance(links_of(p), Links) for p in presets())
    with pytest.raises(ValueError, match=r"runtime\.links must name a preset"):
        RuntimeConfig(links=" ")
    assert job_config("runtime.links=cpu").runtime.links == "cpu"
    assert refused("nosuch") == [
        "runtime.links: runtime.links='nosuch' is no preset (cpu, h200) and no file path"
    ]


def test_a_links_file_is_read_whole_and_each_mistake_names_its_key_and_file(tmp_path: Path) -> None:
    good = written(tmp_path, {**H200, "machine": "mine", "h2d_gbps": 12.5})
    assert job_config(f"runtime.links={good}").runtime.links == str(good)
    assert links_of(str(good)).h2d_gbps == 12.5
    bad = written(tmp_path, {**H200, "d2h_gbps": -1, "nvlink_gbps": 900}, "bad.yaml")
    said = refused(str(bad))
    assert any("runtime.links.nvlink_gbps" in s and "not a field of Links" in s for s in said)
    del H200["broadcast_gbps"]  # a copy per test: read again above
    short = written(tmp_path, H200, "short.yaml")
    assert any("lacks broadcast_gbps" in s and str(short) in s for s in refused(str(short)))
    ranged = written(tmp_path, {**links_of("h200").__dict__, "d2h_gbps": 0}, "zero.yaml")
    assert refused(str(ranged)) == [
        f"runtime.links.d2h_gbps: {ranged}:3: runtime.links.d2h_gbps: must be a number from "
        "0.001 to 10000.0 (GB/s)"
    ]


@pytest.mark.parametrize(
    ("field", "value", "range_"),
    [
        ("h2d_gbps", "hunter2", "from 0.001 to 10000.0 (GB/s)"),
        ("d2h_gbps", "[hunter2]", "from 0.001 to 10000.0 (GB/s)"),
        ("broadcast_gbps", "1.0e-300", "from 0.001 to 10000.0 (GB/s)"),
        ("file_read_gbps", "20000", "from 0.001 to 10000.0 (GB/s)"),
        ("copy_call_us", "1.0e+300", "from 0.001 to 100000.0 (us)"),
        ("machine", "{hunter2: 1}", "must be a text"),
    ],
)
def test_a_links_file_mistake_names_the_key_and_range_never_the_value(
    tmp_path: Path, field: str, value: str, range_: str
) -> None:
    """`runtime.links.h2d_gbps='hunter2' is not a float` echoed a file's values; a speed of
    1e-300 printed estimates 300 digits long."""
    path = tmp_path / "links.yaml"
    text = yaml.safe_dump({k: v for k, v in links_of("h200").__dict__.items() if k != field})
    path.write_text(text + f"{field}: {value}\n")
    (said,) = refused(str(path))
    assert said.startswith(f"runtime.links.{field}: {path}:") and range_ in said, said
    assert "hunter2" not in said and "300" not in said and "20000" not in said


def test_a_planted_link_or_fifo_is_refused_before_it_is_read(tmp_path: Path) -> None:
    target = written(tmp_path, {**links_of("h200").__dict__})
    (tmp_path / "link.yaml").symlink_to(target)
    assert any("not read" in s for s in refused(str(tmp_path / "link.yaml")))
    os.mkfifo(tmp_path / "fifo.yaml")
    assert any("not a regular file" in s for s in refused(str(tmp_path / "fifo.yaml")))
    (tmp_path / "tagged.yaml").write_text("machine: !!python/object:os.system x\n")
    assert any("YAML tags are not allowed" in s for s in refused(str(tmp_path / "tagged.yaml")))


def test_the_links_bench_on_cpu_writes_a_file_runtime_links_reads(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["bench", "bench=links", "topology=tp2", "bench.floor_bytes=1048576"]
    args += ["bench.repeats=2", "bench.warmup=0", f"bench.out_dir={out}", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] and result["file"] == str(out / "links.yaml")
    sources = {r["link"]: r["source"] for r in result["rows"]}
    measured = {k for k, v in sources.items() if v == "measured"}
    assert measured == {
        "h2d_gbps", "d2h_gbps", "h2d_kernel_gbps", "d2h_kernel_gbps", "copy_call_us",
        "file_read_gbps", "file_read_aggregate_gbps", "file_write_gbps",
    }  # fmt: skip
    assert sources["broadcast_gbps"] == "preset h200"  # no second GPU on a CPU machine
    links = links_of(str(out / "links.yaml"))
    assert all(r["value"] == round(getattr(links, r["link"]), 3) for r in result["rows"])
    assert all(getattr(links, k) > 0 for k in measured)
    explained = subprocess.run(
        [sys.executable, "-m", "pipeline", "explain", "strategy=auto", "topology=tp2",
         f"runtime.links={out / 'links.yaml'}", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["estimates"]["links"] == "bench links on cpu"
