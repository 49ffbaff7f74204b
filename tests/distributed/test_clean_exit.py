"""A script that closes its engine but leaves the default group to the interpreter's exit
exits cleanly, every time. Its engine's gloo groups outlived `close`, and one of their threads
that freed a collective's tensors after the interpreter began to finalize took the GIL there
and aborted the process ("terminate called without an active exception"), in about one run
of sixteen on a busy machine; `test_engine_groups` checks the cause itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

RUNS = 12

SCRIPT = """
import sys

import torch.distributed as dist

import pipeline

job = pipeline.compose(
    ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"]
    + [f"storage.path={sys.argv[1]}"]
)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
engine = pipeline.create_engine(job)
print(engine.lookup(pipeline.page_keys(job, ["9f2c" * 16, "41ab" * 16])))
engine.close()
"""
"""The whole script: no dist.destroy_process_group() before it ends."""


def test_a_script_that_closes_its_engine_exits_cleanly_every_time(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    store.mkdir()
    for pair in range(0, RUNS, 2):  # two at a time: a busy machine is where it aborted
        runs = [
            subprocess.Popen(
                [sys.executable, str(script), str(store)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            for run, proc in enumerate(runs, pair):
                out, err = proc.communicate(timeout=120)
                assert (proc.returncode, out) == (0, "0\n"), (run, err[-2000:])
        finally:
            for proc in runs:
                proc.kill()  # one left running after a failure (a no-op once it has ended)
