"""The public API as a serving engine uses it: the README's example runs as written, the
example scheduler drives hits and misses (one rank, and two under torchrun), and adopted KV
tensors that do not fit are refused naming the tensor."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import pipeline
from pipeline.engine.l3.stores import FileStore

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use from a serving engine") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded back bit-exact"


def counts(stdout: str) -> tuple[int, ...]:
    found = re.search(r"(\d+) hits, (\d+) misses, (\d+) evictions", stdout)
    assert found, stdout
    return tuple(int(n) for n in found.groups())


def test_the_example_scheduler_hits_misses_and_evicts_on_one_rank() -> None:
    done = subprocess.run(
        [sys.executable, "examples/scheduler.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    hits, misses, evictions = counts(done.stdout)
    assert hits + misses == 40 and hits > 0 and misses > 0 and evictions > 0


def test_the_issue_profile_splits_each_path_into_its_pieces(tmp_path: Path) -> None:
    """benchmarks/profile_issue.py, which BENCHMARKS.md's issue-time tables come from, on CPU:
    every fragmented path and direction, each with its plan split and its pieces."""
    out = tmp_path / "profile.txt"
    args = ["--device", "cpu", "--tokens", "64", "--reps", "2", "--only", "fragmented"]
    done = subprocess.run(
        [sys.executable, "benchmarks/profile_issue.py", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    paths = [line for line in lines if " ms (plan " in line]
    split = [line for line in lines if line.startswith("  pieces: ")]
    assert len(paths) == len(split) == 4  # chunked and not, backup and load
    assert all("page_rows" in line and "build_plan" in line for line in split)
    assert all("issue_copies" in line and "follow" in line for line in split)
    assert out.read_text().count("==== 64 ") == 4  # each path's cProfile


@pytest.mark.distributed
def test_the_example_scheduler_runs_on_two_ranks_under_torchrun() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "examples/scheduler.py",
            "topology=tp2",
            "strategy=rotating",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    hits, misses, _ = counts(done.stdout)
    assert hits + misses == 40 and hits > 0


TORCHRUN_2 = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


@pytest.mark.distributed
def test_the_asynchronous_loop_runs_on_two_ranks_under_torchrun() -> None:
    """examples/async_loop.py (docs/engine-api.md shows its loop): each rank waits on its own
    ack with query(), every rank polls once a step; every ack released, every load exact."""
    done = subprocess.run(
        [*TORCHRUN_2, "examples/async_loop.py", "strategy=rotating"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["released 8 backups, 8 of 8 loads bit-exact"] * 2


def tiny_job() -> pipeline.Job:
    return pipeline.compose(["model=tiny_mla", "topology=tp1", "topology.device=cpu"])


def kv(pages: int = 8) -> dict[tuple[str, int], torch.Tensor]:
    return {("kv", i): torch.zeros(pages, 4, 32, dtype=torch.bfloat16) for i in range(5)}


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop(("kv", 3)), r"device_kv\[\('kv', 3\)\].*got missing"),
        (lambda t: t.update({("kv", 2): torch.zeros(8, 4, 16)}), r"\('kv', 2\)\]: dtype torch.f"),
        (lambda t: t.update({("kv", 9): torch.zeros(8, 4, 32)}), "units the model lacks"),
        (
            lambda t: t.update(
                {("kv", 0): torch.zeros(8, 32, 4, dtype=torch.bfloat16).transpose(1, 2)}
            ),
            "contiguous",
        ),
        (lambda t: t.update({("kv", 1): torch.zeros(())}), r"\('kv', 1\).*got \(\)"),
        (  # one tensor for two layers: one layer's loads would write into the other
            lambda t: t.update({("kv", 4): t[("kv", 3)]}),
            r"device_kv\[\('kv', 3\)\] and device_kv\[\('kv', 4\)\] share memory",
        ),
        (  # overlapping views of one buffer
            lambda t: t.update(
                dict(
                    zip(
                        [("kv", 0), ("kv", 1)],
                        (lambda b: (b[:8], b[4:12]))(torch.zeros(12, 4, 32, dtype=torch.bfloat16)),
                        strict=True,
                    )
                )
            ),
            "share memory",
        ),
    ],
)
def test_adopted_kv_that_does_not_fit_is_refused_naming_it(change, message: str) -> None:  # type: ignore[no-untyped-def]
    tensors = kv()
    change(tensors)
    with pytest.raises(ValueError, match=message):
        pipeline.create_engine(tiny_job(), device_kv=tensors)


@pytest.mark.usefixtures("one_rank")
def test_an_adopted_pool_is_the_callers_memory() -> None:
    tensors = kv()
    engine = pipeline.create_engine(tiny_job(), device_kv=tensors)
    try:
        unit = engine.model.units[0]
        assert engine.device_pool.layer(unit).data_ptr() == tensors[("kv", 0)].data_ptr()
        assert engine.sizing.device_pages == 8
    finally:
        engine.close()
    assert dist.is_initialized()  # the caller's group outlives the engine


def test_create_engine_needs_the_callers_process_group_and_store() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        pipeline.create_engine(tiny_job())
    job = pipeline.compose(["model=tiny_mla", "topology=tp1", "storage=file"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"storage\.path"):
            pipeline.create_engine(job)
    finally:
        dist.destroy_process_group()


def stacked_kv(pages: int = 8) -> dict[tuple[str, int], torch.Tensor]:
    """One buffer for every layer, adopted as views of it (the layout the engine allocates)."""
    whole = torch.zeros(5, pages, 4, 32, dtype=torch.bfloat16)
    return {("kv", i): whole[i] for i in range(5)}


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    "layout",
    [
        ("topology.mem_layout=layer_first",),
        ("topology.mem_layout=page_first_direct", "topology.io_backend=direct"),
    ],
)
@pytest.mark.parametrize("chunk_pages", [0, 2, 3])
@pytest.mark.parametrize("adopted", [kv, stacked_kv])
def test_adopted_kv_backs_up_and_loads_back_bit_exact_chunked_or_not(
    adopted,
    chunk_pages: int,
    layout: tuple[str, ...],  # type: ignore[no-untyped-def]
) -> None:
    """The public API as engines combine it: one tensor per layer or views of one buffer,
    each host layout, chunked backups or not (one tensor per layer with chunking failed 8/8:
    the plan gathered batches the copy stage could take only from stacked pools)."""
    job = pipeline.compose(
        [
            "model=tiny_mla",
            "topology=tp1",
            "topology.device=cpu",
            f"strategy.chunk_pages={chunk_pages}",
            *layout,
        ]
    )
    tensors = adopted()
    for i, t in enumerate(tensors.values()):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
    before = {k: t.clone() for k, t in tensors.items()}
    engine = pipeline.create_engine(job, device_kv=tensors)
    try:
        slots = torch.arange(0, 7 * job.model.page_size)  # 7 pages: a partial last batch
        engine.host_allocator.claim(list(range(7)))
        engine.backup(slots, slots).wait()
        for t in tensors.values():
            t.zero_()
        engine.load(slots, slots).done().wait()
        for key, t in tensors.items():
            assert torch.equal(t[:7], before[key][:7]), key
        engine.poll()
    finally:
        engine.close()


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("io_threads", [2, 4])
def test_a_load_from_l3_reads_io_threads_objects_at_once(
    io_threads: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's 4- and 16-thread sides are what they say: every read waits at a barrier
    of `storage.io_threads` parties, which only that many reads in flight at once pass."""
    job = pipeline.compose(
        [
            "model=tiny_mla",
            "topology=tp1",
            "topology.device=cpu",
            "storage=file",
            f"storage.path={tmp_path}",
            f"storage.io_threads={io_threads}",
        ]
    )
    engine = pipeline.create_engine(job)
    try:
        page = job.model.page_size
        slots, host = torch.arange(0, 8 * page), engine.host_slots.alloc(8 * page)
        engine.backup(host, slots).wait()
        keys = engine.l3_keys(list(range(8 * page)))
        engine.write_back(keys, host).wait()
        free = engine.host_slots.alloc(8 * page)
        together = threading.Barrier(io_threads, timeout=120)
        real_read = FileStore.read

        def read(store: FileStore, *args: Any) -> bool:
            together.wait()
            return real_read(store, *args)

        monkeypatch.setattr(FileStore, "read", read)
        loaded = engine.load_from_l3(keys, free, slots)
        assert loaded.hits == 8 and not together.broken
    finally:
        engine.close()
