"""Two serving instances share one store: two independent launches of
examples/shared_store.py (each its own processes and gloo group, with another TP size and
strategy) on one file folder, and on one Mooncake master that the test starts. What the first
writes back, the second looks up and loads bit-exact."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MOONCAKE

from pipeline.jobs.l3_store import master_on_loopback

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "shared_store.py")
LAUNCH_S = 300
WRITER = ["--nproc-per-node", "2", EXAMPLE, "write"]
WRITER_CONFIG = ["topology=tp2", "strategy=rotating"]
READER_CONFIG = ["topology=tp1", "strategy=replicated"]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", *args]


def first_line(process: subprocess.Popen, timeout_s: float) -> str:
    """The first line the process prints (its report), waiting at most `timeout_s`."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 1.0)
        if ready:
            return process.stdout.readline()
        assert process.poll() is None, f"the writer exited with {process.returncode}"
    raise AssertionError(f"the writer said nothing in {timeout_s} s")


def read_back(store: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, EXAMPLE, "read", *READER_CONFIG, *store],
        capture_output=True,
        text=True,
        timeout=LAUNCH_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def shares(report: dict) -> None:
    """Every prefix found whole, loaded whole, and bit-exact."""
    assert report["role"] == "read"
    assert [(p["found"], p["loaded"], p["exact"]) for p in report["prefixes"]] == [(2, 2, True)] * 3


def test_two_launches_share_one_file_folder(tmp_path: Path) -> None:
    store = ["storage=file", f"storage.path={tmp_path}"]
    cold = read_back(store)  # nothing there yet: every prefix a miss
    assert [(p["found"], p["loaded"]) for p in cold["prefixes"]] == [(0, 0)] * 3
    done = subprocess.run(
        torchrun(*WRITER, *WRITER_CONFIG, *store),
        capture_output=True,
        text=True,
        timeout=LAUNCH_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shares(read_back(store))  # the writer is gone: the folder outlives it


@pytest.mark.parametrize("kind", [MOONCAKE])
def test_two_launches_share_one_mooncake_master(tmp_path: Path, kind: str) -> None:
    """The writer holds the memory it lends the store until the reader is done."""
    released, log = tmp_path / "released", tmp_path / "writer.log"
    with master_on_loopback() as (master, metadata), log.open("w") as said:
        store = [
            f"storage={kind}",
            f"storage.master={master}",
            f"storage.metadata_server={metadata}",
        ]
        writer = subprocess.Popen(
            torchrun(*WRITER, "--hold-until", str(released), *WRITER_CONFIG, *store),
            stdout=subprocess.PIPE,
            stderr=said,
            text=True,
            cwd=ROOT,
        )
        try:
            written = json.loads(first_line(writer, LAUNCH_S))
            assert [p["written"] for p in written["prefixes"]] == [2] * 3
            shares(read_back(store))
        finally:
            released.touch()
            writer.wait(timeout=LAUNCH_S)
        assert writer.returncode == 0, log.read_text()[-3000:]
