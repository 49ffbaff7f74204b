"""Shared test helpers: compose real configs into jobs, and run them on real gloo ranks; and
the gate of the Mooncake tests.

Rank-side functions live in `tests/rankfns.py`; spawned ranks import it by name, which works
because pytest puts this folder on sys.path and spawn hands sys.path to its children.

Tests marked `mooncake` start a Mooncake master or client, which need the system library
libibverbs1 and the mooncake package. Where either is missing they skip with a line saying
how to enable them; `--require-mooncake` (`.ci/run` passes it) makes that a failure instead.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from hydra import initialize_config_module

from pipeline.config.compose import Session
from pipeline.config.job import Job
from pipeline.config.sources import SHIPPED
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.jobs.l3_store import master_on_loopback

MOONCAKE_LIBRARY = "libibverbs.so.1"
"""What Mooncake's master and client link (`ldd` shows it for both) and Debian's
libibverbs1 installs."""
MISSING_MOONCAKE = pytest.StashKey[str | None]()
"""Why the Mooncake tests cannot run here (None: they can), found once per session."""
MOONCAKE = pytest.param("mooncake", marks=pytest.mark.mooncake, id="mooncake")
"""The `mooncake` case of a test parametrized over stores."""


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A process group of one CPU rank, as a serving engine would have made (the library
    calls run inside the caller's group)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """vLLM's own cache (its model inspection, ~8 s the first time) in this run's temp
    folder, shared by the run's workers, never the user's ~/.cache/vllm."""
    folder = tmp_path_factory.getbasetemp().parent / "vllm-cache"
    before = os.environ.get("VLLM_CACHE_ROOT")
    os.environ["VLLM_CACHE_ROOT"] = str(folder)  # vLLM's variable, read as it builds a config
    try:
        yield folder
    finally:
        if before is None:
            del os.environ["VLLM_CACHE_ROOT"]
        else:
            os.environ["VLLM_CACHE_ROOT"] = before


def job_config(*overrides: str) -> Job:
    """The typed job `run` would send to its ranks for these overrides."""
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        return Session.compose(list(overrides)).job()


@pytest.fixture(scope="module")
def mooncake() -> Iterator[StorageConfig]:
    """One Mooncake master per test module, used as a given master (storage.master=host:port);
    started only for a test that asks for it (`request.getfixturevalue("mooncake")`)."""
    with master_on_loopback() as (master, metadata):
        yield StorageConfig(
            kind=StorageKind.mooncake,
            master=master,
            metadata_server=metadata,
            segment_bytes=16 << 20,
        )


def mooncake_missing(library: str = MOONCAKE_LIBRARY, package: str = "mooncake") -> str | None:
    """One line saying what the Mooncake tests lack here and how to add it, or None."""
    if importlib.util.find_spec(package) is None:
        return (
            "needs the mooncake package: pip install -e '.[dev]' (or '.[mooncake]' on GPU machines)"
        )
    try:
        ctypes.CDLL(library)
    except OSError:
        return "needs libibverbs1: apt-get install libibverbs1 (Debian/Ubuntu; .ci/run installs it)"
    return None


def mooncake_gate(reason: str | None, *, required: bool) -> None:
    """Skip a Mooncake test that cannot run here, or fail it when it is required."""
    if reason is None:
        return
    if required:
        pytest.fail(f"{reason} (--require-mooncake: the Mooncake tests must run)", pytrace=False)
    pytest.skip(reason)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-mooncake",
        action="store_true",
        help="fail the tests marked mooncake where they cannot run (libibverbs1 or the "
        "mooncake package missing) instead of skipping them; .ci/run passes it",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mooncake: starts a Mooncake master or client (needs libibverbs1)"
    )
    config.stash[MISSING_MOONCAKE] = mooncake_missing()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of a Mooncake test starts a master."""
    if item.get_closest_marker("mooncake") is not None:
        required = bool(item.config.getoption("--require-mooncake"))
        mooncake_gate(item.config.stash[MISSING_MOONCAKE], required=required)


def covering(grid: list[tuple], strength: int) -> list[tuple]:
    """A subset of `grid` (a full product) in which every combination of values of any
    `strength` factors still occurs: greedily, the point covering the most combinations not
    yet covered first."""

    def combinations(point: tuple) -> set:
        return set(itertools.combinations(enumerate(point), strength))

    uncovered, chosen = set().union(*map(combinations, grid)), []
    while uncovered:
        best = max(grid, key=lambda point: len(combinations(point) & uncovered))
        chosen.append(best)
        uncovered -= combinations(best)
    return chosen


def all_pairs(grid: list[tuple]) -> list[tuple]:
    """Every pair of values of any two factors (a covering of strength 2)."""
    return covering(grid, 2)


def free_ports(count: int) -> int:
    """A first port of `count` consecutive ports that are free now, drawn below the kernel's
    ephemeral range: a port from there (what binding port 0 gives) may be handed to another
    process's outgoing connection (a gloo rank's, a ZMQ client's) before the test binds it."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    draw = random.SystemRandom()
    for _ in range(200):
        first = draw.randrange(10000, ephemeral - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as held:
                    held.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise RuntimeError("no free ports")
