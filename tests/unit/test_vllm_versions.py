"""What the connector says of the vLLM release it runs under (docs/vllm.md, "Versions")."""

import pytest

vllm = pytest.importorskip("vllm", reason="needs vLLM: pip install --no-deps -r .ci/vllm.txt")

from pipeline.integrations.vllm.settings import hashes_seeded_at_random  # noqa: E402


@pytest.mark.parametrize(
    ("version", "environ", "at_random"),
    [
        ((0, 26, 0), {}, True),  # os.urandom per process: a store's blocks never hit again
        ((0, 26, 0), {"PYTHONHASHSEED": "0"}, False),
        ((0, 32, 0), {}, False),  # seeded from sha256 itself
    ],
)
def test_random_block_hash_seeds_are_named_where_a_store_would_never_hit_again(
    version: tuple[int, int, int],
    environ: dict[str, str],
    at_random: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm, "__version_tuple__", version)
    assert hashes_seeded_at_random(environ) is at_random
