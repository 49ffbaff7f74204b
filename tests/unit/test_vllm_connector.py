"""`PipelineConnector` under vLLM 0.32.0's real `Scheduler` on CPU, loaded by vLLM's own factory
from `kv_connector_module_path`, on one gloo rank: a prefix computed once is a hit for the next
request sharing it, from the host tier, and from the file store once the host tier is empty
(a fresh connector on the same store); every loaded row checked right after its layer's
`wait_for_layer_load`, before the forward writes it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import eventfns
import msgspec
import pytest
import torch
import zmq

import pipeline
from pipeline.core.checks import ConfigError
from pipeline.core.storage import StorageConfig

vllmfns = pytest.importorskip("vllmfns")
vllmsteps = pytest.importorskip("vllmsteps")

pytestmark = pytest.mark.usefixtures("one_rank", "vllm_cache")

TOKENS = list(range(100, 164))
"""Request A's prompt: 64 tokens, 4 blocks of 16."""
SHARED = 48
"""Request B's prefix shared with A: 3 blocks."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vllmfns.tiny_model_dir(tmp_path_factory.mktemp("vllm-model"))


@contextmanager
def connected(
    model_dir: Path,
    store: Path | StorageConfig,
    policy: str = "fail",
    events_port: int | None = None,
    more: tuple[str, ...] = (),
    device: str = "cpu",
) -> Iterator[tuple]:
    """vLLM's scheduler and one worker, each with the connector vLLM built itself, on a file
    store's folder or a running Mooncake master; both shut down after."""
    overrides = [*store_overrides(store), "workload.num_tokens=64", *more]
    extra = {"overrides": overrides}
    config = vllmfns.vllm_config(
        model_dir,
        connector="PipelineConnector",
        module_path="pipeline.integrations.vllm",
        extra=extra,
        load_failure_policy=policy,
        events_port=events_port,
        device=device,
    )
    scheduler, kv_cache_config = vllmfns.make_scheduler(config)
    worker, caches = vllmfns.make_worker(config, kv_cache_config)
    try:
        yield scheduler, worker, caches
    finally:
        worker.shutdown()
        scheduler.shutdown()


def store_overrides(store: Path | StorageConfig) -> list[str]:
    if isinstance(store, Path):
        return ["storage=file", f"storage.path={store}"]
    return [
        "storage=mooncake",
        f"storage.master={store.master}",
        f"storage.metadata_server={store.metadata_server}",
        f"storage.segment_bytes={store.segment_bytes}",
    ]


class LoadedRows:
    """The rows of a request's shared blocks as each layer's wait returned (the first time
    each layer is waited for)."""

    def __init__(self) -> None:
        self.seen: dict[str, torch.Tensor] = {}

    def __call__(self, worker: int, name: str, kv: torch.Tensor) -> None:
        self.seen.setdefault(name, kv.to("cpu", copy=True))  # as the layer's wait left it

    def check(self, block_ids: list[int], tokens: list[int]) -> None:
        assert len(self.seen) == 2, self.seen.keys()
        vllmfns.check_rows(self.seen, block_ids, tokens[:SHARED])


def run_a(scheduler, worker, caches, forget: bool = True) -> Any:
    """Request A computed; then (`forget`) vLLM's own cache and device blocks forget it."""
    a = vllmfns.make_request("A", TOKENS)
    vllmsteps.run_to_completion(scheduler, vllmsteps.in_process([worker], [caches]), 1, [a])
    if forget:
        assert scheduler.reset_prefix_cache()
        for kv in caches.values():
            kv.zero_()
    return a


def loaded_b(run: Any, loaded: LoadedRows, tokens: list[int]) -> None:
    """vLLM's scheduler took B's shared blocks from the connector, and each layer's wait
    returned them right."""
    stats = run.prefill["B"]
    assert (stats.num_local_cached_tokens, stats.num_external_cached_tokens) == (0, SHARED)
    loaded.check(run.block_ids["B"], tokens)


def run_b(scheduler, worker, caches) -> tuple:
    """Request B (A's first 48 tokens and 10 of its own): what vLLM's scheduler says it
    got from the connector, and the rows each layer's wait returned."""
    tokens = TOKENS[:SHARED] + list(range(500, 510))
    request = vllmfns.make_request("B", tokens)
    loaded = LoadedRows()
    step = vllmsteps.in_process([worker], [caches], loaded)
    run = vllmsteps.run_to_completion(scheduler, step, 1, [request])
    return run, loaded, tokens


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_a_prefix_computed_once_is_loaded_from_the_host_tier_then_the_store(
    device: str, model_dir: Path, tmp_path: Path
) -> None:
    """On cuda (the device machine): vLLM's KV cache on the GPU, each layer's rows read on
    the current stream right after its wait, as attention would read them."""
    store = tmp_path / "store"
    store.mkdir()
    with connected(model_dir, store, device=device) as engine:
        run_a(*engine)  # vLLM's own cache forgets A: the host tier has it
        loaded_b(*run_b(*engine))
    with connected(model_dir, store, device=device) as engine:  # a fresh, empty host tier
        loaded_b(*run_b(*engine))  # the file store holds A's blocks


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def test_a_flipped_byte_in_a_stored_block_is_a_load_error_never_kv(
    device: str, model_dir: Path, tmp_path: Path
) -> None:
    """The block whose object lost a bit (and those after it) is reported to vLLM, which
    recomputes them (kv_load_failure_policy=recompute); its bytes never reach the KV."""
    store = tmp_path / "store"
    store.mkdir()
    with connected(model_dir, store, device=device) as (scheduler, worker, caches):
        a = run_a(scheduler, worker, caches, forget=False)
        job = scheduler.connector.scheduler_side.job
    key = pipeline.page_keys(job, [a.block_hashes[1]])[0]
    (found,) = [p for p in store.rglob(f"{key}*") if p.is_file()]
    data = bytearray(found.read_bytes())
    data[-1] ^= 0x01
    found.write_bytes(bytes(data))

    with connected(model_dir, store, policy="recompute", device=device) as engine:
        run, loaded, tokens = run_b(*engine)
    caches = engine[2]
    assert run.prefill["B"].num_external_cached_tokens == SHARED  # as the lookup found them
    blocks = run.block_ids["B"]
    vllmfns.check_rows(loaded.seen, blocks, tokens[:16])  # the intact block, loaded
    for kv in loaded.seen.values():  # the bad block and the next: never loaded
        assert not kv[blocks[1]].any() and not kv[blocks[2]].any()
    vllmfns.check_rows(caches, blocks, tokens)  # recomputed: every row right in the end


def test_vllm_publishes_the_host_and_store_events_under_its_own_block_hashes(
    model_dir: Path, tmp_path: Path
) -> None:
    """`take_events` feeds vLLM's own publisher: its subscriber's decoder (vLLM's
    `KVEventBatch`) reads the host tier (`CPU`) and the file store (`STORAGE`, `LOCAL`)
    beside vLLM's own device tier (`GPU`), every block under the hash vLLM's own events give
    it, with its parent and its token ids."""
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    store = tmp_path / "store"
    store.mkdir()
    port = eventfns.free_ports(2)
    with connected(model_dir, store, events_port=port) as engine:
        run_a(*engine, forget=False)
        kept = eventfns.replayed(zmq.Context.instance(), f"tcp://127.0.0.1:{port + 1}", 0)
    decode = msgspec.msgpack.Decoder(kv_events.KVEventBatch).decode
    stored = [
        e
        for seq in sorted(kept)
        for e in decode(kept[seq]).events
        if isinstance(e, kv_events.BlockStored)
    ]
    by_medium: dict[tuple, list] = {}
    for e in stored:
        by_medium.setdefault((e.medium, e.locality), []).append(e)
    device = [h for e in by_medium[("GPU", None)] for h in e.block_hashes]
    for tier in (("CPU", None), ("STORAGE", "LOCAL")):
        said = by_medium[tier]
        assert [h for e in said for h in e.block_hashes] == device  # vLLM's own hashes
        assert [e.parent_block_hash for e in said] == [None, *device[:-1]]
        assert [t for e in said for t in e.token_ids] == TOKENS


@pytest.mark.parametrize("kind", ["file", pytest.param("mooncake", marks=pytest.mark.mooncake)])
def test_a_full_host_tier_evicts_its_oldest_blocks_and_the_store_still_has_them(
    kind: str, model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A host tier of 4 blocks: request C's blocks evict A's (their write-backs may still
    run: a page is freed only after its write-back), and B's prefix then comes from the
    store (the file store, or Mooncake) through the same connector."""
    store: Path | StorageConfig = tmp_path / "store"
    if kind == "mooncake":
        store = request.getfixturevalue("mooncake")
    else:
        store.mkdir()
    page_bytes = 2 * 16 * 1152  # 2 layers x a block of 16 rows of 576 bf16
    more = (f"workload.host_bytes={4 * page_bytes}",)
    with connected(model_dir, store, more=more) as (scheduler, worker, caches):
        assert scheduler.connector.scheduler_side.directory.num_pages == 4
        run_a(scheduler, worker, caches, forget=False)
        c = vllmfns.make_request("C", list(range(700, 764)))  # evicts A's blocks
        vllmsteps.run_to_completion(scheduler, vllmsteps.in_process([worker], [caches]), 1, [c])
        assert scheduler.reset_prefix_cache()
        for kv in caches.values():
            kv.zero_()
        loaded_b(*run_b(scheduler, worker, caches))


@pytest.mark.parametrize(
    ("extra", "error", "said"),
    [
        (
            {"overrides": ["model.num_layers=3"]},
            ValueError,
            "the overrides set model.num_layers=3 (vLLM: 2); leave them out",
        ),
        (
            {"overrides": ["model.page_size=64", "topology.tp_size=2"]},
            ValueError,
            "model.page_size=64 (vLLM: 16), topology.tp_size=2 (vLLM: 1)",
        ),
        ({"overrides": "storage=file"}, ValueError, '"overrides" is a list of strings'),
        ({"override": []}, ValueError, "unknown keys ['override']; PipelineConnector reads"),
        (
            {"overrides": ["storage.io_threads=0", "strategy.chunk_pages=-1"]},
            ConfigError,
            "storage.io_threads",
        ),
    ],
)
def test_a_config_that_does_not_fit_is_refused_before_vllm_allocates(
    extra: dict, error: type, said: str, model_dir: Path
) -> None:
    config = vllmfns.vllm_config(
        model_dir,
        connector="PipelineConnector",
        module_path="pipeline.integrations.vllm",
        extra=extra,
    )
    with pytest.raises(error) as refused:
        vllmfns.make_scheduler(config)
    assert said in str(refused.value)
    if error is ConfigError:  # every problem at once
        assert "strategy.chunk_pages" in str(refused.value)


def test_a_host_tier_too_small_for_a_stored_prefix_loads_what_fits(
    model_dir: Path, tmp_path: Path
) -> None:
    """A host tier of 2 blocks cannot take B's 3 stored blocks: the connector offers vLLM
    the 2 that fit (never a load bound to fail, which vLLM's default policy would fail the
    request for), and vLLM computes the rest."""
    store = tmp_path / "store"
    store.mkdir()
    with connected(model_dir, store) as engine:
        run_a(*engine, forget=False)
    more = (f"workload.host_bytes={2 * 2 * 16 * 1152}", "workload.num_tokens=32")  # 2 blocks
    with connected(model_dir, store, more=more) as engine:
        scheduler, _, caches = engine
        assert scheduler.connector.scheduler_side.directory.num_pages == 2
        run, loaded, tokens = run_b(*engine)
    stats = run.prefill["B"]
    assert (stats.num_local_cached_tokens, stats.num_external_cached_tokens) == (0, 32)
    vllmfns.check_rows(loaded.seen, run.block_ids["B"], tokens[:32])  # loaded, then waited
    vllmfns.check_rows(caches, run.block_ids["B"], tokens)  # and the rest computed
