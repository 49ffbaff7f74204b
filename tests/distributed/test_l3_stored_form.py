"""One stored form, whoever wrote it: a file store written by every strategy at tp 1, 2 and 4
(each with another host layout: a unit's page one run, or rows a pitch apart) is found and
loaded bit-exact by every other strategy and tp, on real gloo ranks."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import l3fns
import pytest
from conftest import job_config

from pipeline.config.job import Job
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

LAYOUTS = {
    1: ("topology.mem_layout=layer_first",),
    2: ("topology.mem_layout=page_first",),  # token-major: each row read into place
    4: ("topology.mem_layout=page_first_direct", "topology.io_backend=direct"),
}
INTO = {1: "pool", 2: "pool", 4: "pool"}
"""Where each tp's layout's reads land: straight into the pool's rows (a keyed store's reads
of page_first go through staging: the keyed store's test below)."""
CONFIGS = [
    (tp, strategy)
    for tp in (1, 2, 4)
    for strategy in (("replicated",) if tp == 1 else ("replicated", "single_source", "rotating"))
]
"""Every strategy that is active at each tp (tp 1 has no peers to deduplicate over)."""


def grid_job(tp: int, strategy: str, folder: Path) -> Job:
    job = job_config(
        "model=tiny_dsa",
        f"topology=tp{tp}",
        f"strategy={strategy}",
        "storage=file",
        "workload.num_tokens=32",
        "workload.device_tokens=64",
        *LAYOUTS[tp],
    )
    assert job.strategy.config.name == strategy, "every config of the grid is active"
    return dataclasses.replace(job, storage=StorageConfig(kind=StorageKind.file, path=str(folder)))


def test_every_strategy_and_tp_reads_what_every_other_wrote(tmp_path: Path) -> None:
    """Every config writes its prefix, then every config reads every prefix (the configs of
    one tp in one launch: their engines one after another in its world)."""
    by_tp = {tp: [i for i, c in enumerate(CONFIGS) if c[0] == tp] for tp in (1, 2, 4)}
    for tp, indices in by_tp.items():
        jobs = [(grid_job(tp, CONFIGS[i][1], tmp_path), i) for i in indices]
        written = launch(l3fns.write_prefixes, jobs, tp, backend="gloo", timeout_s=120)
        assert written == [[l3fns.GRID_PAGES] * len(jobs)] * tp
    for tp, indices in by_tp.items():
        jobs = [(grid_job(tp, CONFIGS[i][1], tmp_path), len(CONFIGS)) for i in indices]
        reports = launch(l3fns.read_prefixes_of, jobs, tp, backend="gloo", timeout_s=120)
        assert reports is not None
        for rank, per_job in enumerate(reports):
            for i, (*found, landed) in zip(indices, per_job, strict=True):
                strategy = CONFIGS[i][1]
                # a single_source peer reads nothing; every read lands where its layout allows
                expected = [] if strategy == "single_source" and rank else [INTO[tp]]
                assert landed == expected, f"tp{tp} {strategy} rank {rank}"
                for (found_pages, hits, mismatch), writer in zip(found, CONFIGS, strict=True):
                    where = f"tp{tp} {strategy} rank {rank} reading tp{writer[0]} {writer[1]}'s"
                    assert (found_pages, hits, mismatch) == (3, 3, ""), where


def test_a_keyed_store_serves_its_objects_only_to_readers_with_its_key(tmp_path: Path) -> None:
    """S4: with storage.auth_key_file, objects carry keyed MACs; a reader without the key, or
    with another, finds them present but loads none (each a counted miss), never bytes."""
    store = tmp_path / "store"
    store.mkdir()
    keys = {}
    for name in ("ours", "theirs"):
        keys[name] = tmp_path / name
        keys[name].write_bytes(os.urandom(32))
        keys[name].chmod(0o600)  # a key file others may read is refused

    def keyed(key: str | None) -> Job:
        job = grid_job(2, "rotating", store)
        return dataclasses.replace(
            job,
            storage=dataclasses.replace(
                job.storage, auth_key_file=None if key is None else str(keys[key])
            ),
        )

    written = launch(l3fns.write_prefix, (keyed("ours"), 0), 2, backend="gloo", timeout_s=120)
    assert written == [l3fns.GRID_PAGES] * 2
    for reader, hits in (("ours", 3), (None, 0), ("theirs", 0)):
        reports = launch(l3fns.read_prefixes, (keyed(reader), 1), 2, backend="gloo", timeout_s=120)
        assert reports is not None
        for (found, loaded, mismatch), landed in reports:
            assert (found, loaded, mismatch) == (3, hits, ""), reader
            # a keyed check does not combine: page_first's rows go through staging
            assert landed == (["staging"] if hits else []), reader
