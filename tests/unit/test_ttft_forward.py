"""The ttft bench's synthetic forward: its FLOPs follow from the published config, it issues
exactly those FLOPs, and on a real engine it reads each layer only after that layer's load
event (a forward that does not wait reads the poisoned pages instead)."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import job_config

from pipeline.core.checks import ConfigError
from pipeline.engine.cuda.streams import InlineStream
from pipeline.engine.factory import open_engine
from pipeline.jobs.bench.forward import (
    DEEPSEEK_V3,
    TINY,
    SyntheticForward,
    forward_flops,
    published_config,
    query_blocks,
)
from pipeline.jobs.bench.ttft_case import Prefix
from pipeline.jobs.contents import POISON, poison


def test_deepseek_v3s_layer_params_are_its_published_configs_on_one_tp8_rank() -> None:
    hidden, heads, q_lora, kv_lora, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    down = hidden * q_lora + hidden * (kv_lora + rope)  # q_a_proj, kv_a_proj_with_mqa
    per_head = q_lora * (nope + rope) + kv_lora * (nope + v) + v * hidden  # q_b, kv_b, o_proj
    dense = down + (heads * per_head + 3 * hidden * 18432) // 8
    moe = down + hidden * 256 + (heads * per_head + 9 * 3 * hidden * 2048) // 8
    assert [DEEPSEEK_V3.layer_params(i) for i in (0, 2, 3, 60)] == [dense, dense, moe, moe]
    assert DEEPSEEK_V3.heads_per_rank == 16 and DEEPSEEK_V3.key_dim == 576
    # the KV row the model config names is the latent row the attention reads
    model = job_config("model=deepseek_v3").model
    assert model.kv_row_bytes == DEEPSEEK_V3.key_dim * 2
    assert job_config().model.kv_row_bytes == TINY.key_dim * 2


@pytest.mark.parametrize(("prefix", "new"), [(16384, 128), (65536, 8192), (0, 73728)])
def test_forward_flops_are_params_times_tokens_plus_causal_attention(prefix: int, new: int) -> None:
    config, layers = DEEPSEEK_V3, 61
    params = sum(config.gemm_columns(i) * config.hidden for i in range(layers))
    exact = sum(config.layer_params(i) for i in range(layers))
    assert 0 <= params - exact < exact / 1000  # GEMM columns rounded up to 128
    per_pair = 2 * 16 * (576 + 512)  # absorbed MLA: scores over 576, values over 512
    exact_causal = per_pair * new * (prefix + (new + 1) / 2)
    block = max(stop - start for start, stop in query_blocks(config, prefix, new))
    attention = (forward_flops(config, layers, prefix, new) - 2 * new * params) / layers
    # causal at block granularity: at most half a block of extra keys per query token
    assert exact_causal <= attention <= exact_causal + per_pair * new * block / 2


def test_gemm_columns_and_query_blocks_come_in_multiples_of_128() -> None:
    assert {DEEPSEEK_V3.gemm_columns(i) % 128 for i in range(61)} == {0}
    for prefix, new in [(16384, 1024), (16384, 8192), (0, 17408), (65536, 8192)]:
        blocks = query_blocks(DEEPSEEK_V3, prefix, new)
        assert blocks[0][0] == 0 and blocks[-1][1] == new
        assert all((stop - start) % 128 == 0 for start, stop in blocks[:-1])


def test_the_forward_issues_the_flops_it_is_sized_to() -> None:
    forward = SyntheticForward(TINY, 5, torch.device("cpu"), prefix=40, new=12)
    digests = forward.run(InlineStream(5.0), None, None)
    assert digests == [] and forward.flops == forward_flops(TINY, 5, 40, 12)


def test_a_model_without_a_published_compute_config_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as e:
        published_config(job_config("model=tiny_mha").model)
    assert e.value.problems[0].key == "model"
    assert "tiny_mha" in str(e.value)


@pytest.mark.usefixtures("one_rank")
def test_the_overlapped_forward_reads_each_layer_after_its_load_event() -> None:
    job = job_config(
        "topology=tp1",
        "workload.num_tokens=64",
        "workload.device_tokens=128",
        "workload.host_ratio=0.5",
    )
    engine = open_engine(job.recipe(), 0)
    try:
        prefix = Prefix(engine, 64)
        layers = engine.model.num_layers
        forward = SyntheticForward(TINY, layers, engine.runtime.device, prefix=64, new=8)
        fwd, held = engine.runtime.forward_stream, threading.Event()
        poison(engine, prefix.target)
        engine.runtime.load_stream.submit(lambda: held.wait(30))  # the load cannot start yet
        loading = prefix.load()
        # negative control: a forward that does not wait reads the poison, layer by layer
        blind = forward.run(fwd, None, prefix.layers())
        poisoned = [POISON * sum(p.nbytes for p in pages) for pages in prefix.layers()]
        assert [int(d) for d in blind] == poisoned
        threading.Timer(0.05, held.set).start()  # lets the load go while the forward waits
        order: list[tuple[str, int]] = []
        digests = forward.run(fwd, loading, prefix.layers(), order)
        fwd.wait_event(loading.done(fwd))
        assert [int(d) for d in digests] == prefix.expected_digests() != poisoned
        assert order == [(s, layer) for layer in range(layers) for s in ("wait", "compute")]
        prefix.release()
    finally:
        engine.close()
