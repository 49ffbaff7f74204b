"""Adopting a serving engine's own KV tensors (`create_engine(job, device_kv=...)`): the
layouts engines keep are taken as views of the caller's memory (SGLang's MLA buffer
`[tokens, 1, dim]`, vLLM's `[blocks, block_size, dim]`, a stacked `[layers, pages, page, dim]`),
and what cannot be taken is refused saying what was expected and what to do."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import pipeline

LAYERS, PAGES, PAGE, DIM = 5, 8, 4, 32  # tiny_mla: 5 layers, pages of 4 tokens, 64 B bf16 rows
Kv = dict[tuple[str, int] | str, torch.Tensor]


pytestmark = pytest.mark.usefixtures("one_rank")


def tiny_job(*overrides: str) -> pipeline.Job:
    return pipeline.compose(["model=tiny_mla", "topology=tp1", "topology.device=cpu", *overrides])


def round_trip(tensors: Kv, pages_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Back up 3 pages of every layer, zero them in the caller's tensors, load them back:
    the caller's own memory (seen page-wise by `pages_of`) holds the bytes again."""
    for i, t in enumerate(tensors.values()):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
    before = {k: t.clone() for k, t in tensors.items()}
    engine = pipeline.create_engine(tiny_job(), device_kv=tensors)  # type: ignore[arg-type]
    try:
        assert engine.sizing.device_pages == PAGES
        slots = torch.arange(0, 3 * PAGE)
        engine.host_allocator.claim([0, 1, 2])
        engine.backup(slots, slots).wait()
        for t in tensors.values():
            t.zero_()
        engine.load(slots, slots).done().wait()
        for key, t in tensors.items():
            assert torch.equal(pages_of(t)[..., :3, :, :], pages_of(before[key])[..., :3, :, :])
            assert not pages_of(t)[..., 3:, :, :].any(), key  # the rest untouched
    finally:
        engine.close()


def test_sglangs_mla_buffer_of_tokens_is_taken_as_pages() -> None:
    """SGLang keeps an MLA layer as [tokens, 1, kv_lora_rank + rope dim]."""
    tensors: Kv = {
        ("kv", i): torch.zeros(PAGES * PAGE, 1, DIM, dtype=torch.bfloat16) for i in range(LAYERS)
    }
    round_trip(tensors, lambda t: t.view(PAGES, PAGE, DIM))


def test_vllms_blocks_of_one_page_each_are_taken_as_they_are() -> None:
    """vLLM keeps an MLA layer as [num_blocks, block_size, head_size]: a block is a page."""
    tensors: Kv = {
        ("kv", i): torch.zeros(PAGES, PAGE, DIM, dtype=torch.bfloat16) for i in range(LAYERS)
    }
    round_trip(tensors, lambda t: t)


def test_a_stacked_buffer_of_every_layer_is_taken_under_its_pool_kind() -> None:
    round_trip({"kv": stacked()}, lambda t: t)


def per_layer() -> Kv:
    return {("kv", i): torch.zeros(PAGES, PAGE, DIM, dtype=torch.bfloat16) for i in range(LAYERS)}


def stacked(layers: int = LAYERS) -> torch.Tensor:
    return torch.zeros(layers, PAGES, PAGE, DIM, dtype=torch.bfloat16)


def bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        pytest.param(
            {**per_layer(), ("kv", 0): bf16(PAGES, 2 * PAGE, DIM)},
            r"device_kv\[\('kv', 0\)\]: \[blocks, block_size, dim\] with block_size 8 but "
            r"model.page_size=4: a block must be one page \(set model.page_size=8\)",
            id="vllm-block-size",
        ),
        pytest.param(
            {**per_layer(), ("kv", 0): bf16(PAGES * PAGE - 1, 1, DIM)},
            r"device_kv\[\('kv', 0\)\]: \[tokens, 1, dim\] of 31 tokens is not whole pages of "
            r"model.page_size=4: adopt t\[:28\]",
            id="sglang-partial-page",
        ),
        pytest.param(
            {**per_layer(), ("kv", 0): stacked()},
            r"device_kv\[\('kv', 0\)\]: a stacked \[layers, pages, page_size, dim\] tensor "
            r"\(5, 8, 4, 32\): give it whole as device_kv=\{'kv': t\}, or one view per layer",
            id="stacked-under-a-layer",
        ),
        pytest.param(
            {"kv": stacked(LAYERS - 1)},
            r"device_kv\['kv'\]: a stacked tensor of 4 layers; the model has 5 kv layers",
            id="stacked-too-few",
        ),
        pytest.param(
            {"kv": stacked(), ("kv", 0): bf16(PAGES, PAGE, DIM)},
            r"device_kv: \('kv', 0\) is in device_kv\['kv'\] too: give each layer once",
            id="stacked-and-a-layer",
        ),
        pytest.param(
            {**per_layer(), ("kv", 0): bf16(PAGES, PAGE, 2 * DIM)},
            r"device_kv\[\('kv', 0\)\]: rows of 64 elements; model tiny_mla keeps 32 "
            r"\(model.kv_row_bytes=64 of bf16\)",
            id="row-elements",
        ),
        pytest.param(
            {**per_layer(), ("kv", 0): torch.zeros(PAGES, PAGE, DIM)},
            r"device_kv\[\('kv', 0\)\]: dtype torch.float32; model.kv_dtype=bf16 keeps "
            r"torch.bfloat16",
            id="dtype",
        ),
    ],
)
def test_a_layout_that_cannot_be_taken_says_what_was_expected_and_what_to_do(
    tensors: Kv, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        pipeline.create_engine(tiny_job(), device_kv=tensors)  # type: ignore[arg-type]


def test_a_view_that_is_not_contiguous_is_refused_saying_so() -> None:
    """The right shape, but rows strided out of a wider buffer: a copy would not be the
    caller's memory, so it is refused, saying why (it said "need a contiguous (8, 4, 32)
    ... got (8, 4, 32)")."""
    wide = torch.zeros(PAGES, PAGE, 2 * DIM, dtype=torch.bfloat16)
    tensors = {
        ("kv", i): torch.zeros(PAGES, PAGE, DIM, dtype=torch.bfloat16) for i in range(LAYERS)
    }
    tensors[("kv", 2)] = wide[..., :DIM]
    with pytest.raises(ValueError) as refused:
        pipeline.create_engine(tiny_job(), device_kv=tensors)
    said = str(refused.value)
    assert said.startswith("device_kv[('kv', 2)]: not contiguous (strides (256, 64, 1); "), said
    assert "(128, 32, 1)" in said and "a .contiguous() copy would not be your KV" in said
