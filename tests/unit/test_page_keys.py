"""Page keys from an engine's own block hashes (`pipeline.page_keys`), and the namespace's
weights revision and tenant (`storage.model_revision`, `storage.tenant`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipeline
from pipeline.core.checks import ConfigError
from pipeline.core.l3 import check_keys, namespace
from pipeline.core.l3_keys import block_keys
from pipeline.core.l3_owned import is_object_name
from pipeline.core.storage import StorageConfig

SPACE = "v3-bf16-p4-0123456789abcdef"
SGLANG = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
"""A SHA-256 in hex, as SGLang's radix cache hashes a page."""


def test_every_kind_of_engine_hash_gives_a_page_key() -> None:
    hashes = [SGLANG, 5, -5, 1 << 200, b"\x00" * 32, "5", b"5"]
    keys = block_keys(hashes, SPACE)
    check_keys(keys, len(hashes))  # what write_back, lookup and load_from_l3 take
    assert len(set(keys)) == len(hashes)  # 5, "5" and b"5" are three hashes
    assert block_keys(hashes, SPACE) == keys
    assert block_keys(hashes, SPACE + "-tother") != keys  # another namespace, other keys


def test_a_key_is_the_same_in_every_process() -> None:
    """Python's hash() of a str differs per process (PYTHONHASHSEED): keys must not."""
    code = (
        "from pipeline.core.l3_keys import block_keys; "
        f"print(block_keys([{SGLANG!r}, -7, b'x'], {SPACE!r}))"
    )
    said = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)},
        ).stdout
        for seed in ("1", "2")
    }
    assert said == {f"{block_keys([SGLANG, -7, b'x'], SPACE)}\n"}


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("", "hashes[1]: an empty str names no block"),
        (b"", "hashes[1]: an empty bytes names no block"),
        (True, "hashes[1]=True: a bool is not a block hash"),
        (1.5, "hashes[1]: a float is not a block hash"),
        (None, "hashes[1]: a NoneType is not a block hash"),
        ((1, 2), "hashes[1]: a tuple is not a block hash"),
    ],
)
def test_what_is_not_a_block_hash_is_refused_by_its_index(bad: object, said: str) -> None:
    with pytest.raises(ValueError) as refused:
        block_keys([SGLANG, bad], SPACE)  # type: ignore[list-item]
    assert str(refused.value).startswith(said), refused.value


def test_page_keys_are_of_the_jobs_namespace() -> None:
    job = pipeline.compose(["model=tiny_mla"])
    tenant = pipeline.compose(["model=tiny_mla", "storage.tenant=acme"])
    assert pipeline.page_keys(job, [SGLANG]) == block_keys([SGLANG], namespace(job.model))
    assert pipeline.page_keys(tenant, [SGLANG]) != pipeline.page_keys(job, [SGLANG])


def test_without_a_revision_or_tenant_the_namespace_is_the_one_stored_objects_have() -> None:
    """Pinned: objects written before the two knobs existed keep being found."""
    model = pipeline.compose(["model=tiny_mla"]).model
    assert namespace(model) == "v3-bf16-p4-032365e5c42bbfdf"
    assert namespace(model, "", "") == namespace(model)


def test_another_revision_or_tenant_is_another_namespace() -> None:
    model = pipeline.compose(["model=tiny_mla"]).model
    spaces = {
        namespace(model, revision, tenant)
        for revision in ("", "ckpt-1", "ckpt-2")
        for tenant in ("", "acme", "globex")
    }
    assert len(spaces) == 9
    tenant = namespace(model, "ckpt-1", "acme")
    assert tenant.endswith("-tacme") and is_object_name(f"{tenant}/ab/{'ab' * 16}")


@pytest.mark.parametrize(
    "bad", ["a/b", "..\\x", "x" * 65, "tenant one", "t\x00", "ü"], ids=lambda s: repr(s)[:12]
)
@pytest.mark.parametrize("key", ["model_revision", "tenant"])
def test_a_revision_or_tenant_that_could_name_other_files_is_refused(key: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"storage.{key}=.*letters, digits"):
        StorageConfig(**{key: bad})
    StorageConfig(**{key: "Ckpt_1.0-" + "x" * 55})  # 64 characters of the safe ones
