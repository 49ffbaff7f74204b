"""`workload.host_bytes`: the host budget of each rank in bytes (an int, or a size such as
`64GiB`) instead of `workload.host_ratio`; refused beside it, checked like the other
workload keys, and the one budget every pool is sized by (plan, validate, run, the API)."""

from __future__ import annotations

import pytest
import torch

import pipeline
from pipeline.core.checks import ConfigError
from pipeline.core.sizing import parse_bytes

TINY = ["model=tiny_mla", "topology=tp1", "topology.device=cpu"]
PAGE_BYTES = 5 * 4 * 64  # tiny_mla: a page of 4 tokens of 5 layers of 64 B rows


@pytest.mark.parametrize(
    ("text", "size"),
    [("64GiB", 64 << 30), ("1.5 KiB", 1536), ("2MB", 2_000_000), ("4096", 4096), ("7b", 7)],
)
def test_a_size_is_bytes_or_a_number_with_a_unit(text: str, size: int) -> None:
    assert parse_bytes(text) == size


def problems(*overrides: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as refused:
        pipeline.compose([*TINY, *overrides])
    return [(p.key, p.message) for p in refused.value.problems]


def test_both_a_ratio_and_bytes_are_refused_naming_both() -> None:
    assert problems("workload.host_ratio=3", "workload.host_bytes=64KiB") == [
        (
            "workload.host_bytes",
            "workload.host_bytes and workload.host_ratio are both set: give one "
            "(the host budget in bytes, or as a ratio of the device pool)",
        )
    ]


@pytest.mark.parametrize(
    "value", ["nan", "inf", "-1", "0", "64XB", "1e300", "2PiB", "1.3B", "'64 GiB GiB'"]
)
def test_a_size_that_is_not_a_whole_number_of_bytes_in_range_is_refused(value: str) -> None:
    ((key, message),) = problems(f"workload.host_bytes={value}")
    assert key == "workload.host_bytes"
    assert message.startswith("workload.host_bytes="), message
    assert "a whole number of bytes from 1 to 1e15, e.g. 64GiB" in message, message


def test_the_pool_sizing_takes_the_bytes_exactly(one_rank: None) -> None:
    """64 KiB hold 51 whole pages of 1280 B; an adopted device pool of any size leaves the
    budget in bytes as it is (a ratio would scale with it)."""
    small = ["workload.num_tokens=16", "workload.device_tokens=64"]
    job = pipeline.compose([*TINY, *small, "workload.host_bytes=64KiB"])
    for kv in (None, {("kv", i): torch.zeros(32, 4, 32, dtype=torch.bfloat16) for i in range(5)}):
        engine = pipeline.create_engine(job, device_kv=kv)
        try:
            assert engine.sizing.host.num_pages == (64 << 10) // PAGE_BYTES
            assert engine.sizing.host.pool_bytes == 51 * PAGE_BYTES
        finally:
            engine.close()


def test_a_budget_too_small_for_the_transfer_names_host_bytes() -> None:
    ((key, message),) = problems("workload.host_bytes=4KiB")
    assert key == "workload.host_bytes"
    assert message.endswith("raise workload.host_bytes"), message


def test_without_either_the_ratio_is_two() -> None:
    job = pipeline.compose(TINY)
    assert (job.workload.host_ratio, job.workload.host_bytes) == (None, None)
    assert (job.budget().host_ratio, job.budget().host_bytes) == (2.0, None)
