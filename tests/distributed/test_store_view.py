"""A scheduler's view of the store (`pipeline.open_store`): a process with no rank looks up
what gloo ranks wrote back, for a file store and a Mooncake master, and answers what every
rank's `Engine.lookup` answers; page keys of SGLang's and vLLM's hashes round-trip bit-exact;
another weights revision or tenant finds nothing (see tests/viewfns.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import viewfns
from conftest import MOONCAKE

import pipeline
from pipeline.jobs.l3_store import master_on_loopback
from pipeline.jobs.launch import launch

pytestmark = pytest.mark.distributed

KINDS = [("tiny_mla", "rotating"), ("tiny_mha", "replicated")]
"""One object per page for both ranks (rotating: each reads its own layers of it), and one
per rank's share of the heads (MHA)."""


def jobs(model: str, strategy: str, store: list[str]) -> tuple[pipeline.Job, list[pipeline.Job]]:
    """The job, and jobs on the same store of another weights revision and another tenant."""
    line = [
        f"model={model}",
        f"strategy={strategy}",
        "topology=tp2",
        f"workload.num_tokens={viewfns.PAGES * 4}",
        "workload.device_tokens=64",
        *store,
    ]
    others = [["storage.model_revision=ckpt-2"], ["storage.tenant=acme"]]
    return pipeline.compose(line), [pipeline.compose([*line, *o]) for o in others]


def run(tmp_path: Path, model: str, strategy: str, store: list[str]) -> None:
    job, others = jobs(model, strategy, store)
    ranks = launch(
        viewfns.write_and_look, (job, others, tmp_path), 2, backend="gloo", timeout_s=120
    )
    assert ranks is not None
    every = {name: min(r["found"][name] for r in ranks) for name in ranks[0]["found"]}
    assert every == {"sglang": 4, "vllm": 4, "tokens": 4, "damaged": 2, "half": 2, "cold": 0}
    said = ranks[0]["scheduler"]
    assert said["found"] == every  # what every rank's lookup finds
    assert said["contains"] == [True, True, False, False] and said["same_keys"]
    assert said["others"] == [[0, 0, 0], [0, 0, 0]]  # another revision, another tenant: a miss
    assert [r["exact"] for r in ranks] == [{"sglang": "", "vllm": "", "tokens": ""}] * 2
    if model == "tiny_mha":  # the last rank's share of page 2 is gone: only its lookup says so
        assert [r["found"]["damaged"] for r in ranks] == [4, 2]


@pytest.mark.parametrize(("model", "strategy"), KINDS)
def test_a_scheduler_finds_what_ranks_wrote_to_a_file_store(
    tmp_path: Path, model: str, strategy: str
) -> None:
    (tmp_path / "store").mkdir()
    store = ["storage=file", f"storage.path={tmp_path / 'store'}"]
    run(tmp_path, model, strategy, store)
    job, others = jobs(model, strategy, store)  # the ranks are gone: the folder outlives them
    asked = viewfns.queries(job, pipeline.open_store(job).keys(viewfns.TOKENS))
    said = viewfns.scheduler(job, others, asked)  # this process, which has no process group
    assert said["found"]["sglang"] == 4 and said["found"]["damaged"] == 2
    assert said["others"] == [[0, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize("kind", [MOONCAKE])
def test_a_scheduler_finds_what_ranks_wrote_to_a_mooncake_master(tmp_path: Path, kind: str) -> None:
    with master_on_loopback() as (master, metadata):
        given = [f"storage.master={master}", f"storage.metadata_server={metadata}"]
        run(tmp_path, "tiny_mha", "replicated", [f"storage={kind}", *given])
