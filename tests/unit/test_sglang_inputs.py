"""What SGLang hands the backend, refused where it is wrong (issue 62): the extra config's types
(a boolean that is a string, interface_v1 other than 0 or 1, a string io_threads, a number as
path), keys that are not SGLang's page hashes, and host slots that are sparse or have no data,
each a ValueError naming the key or argument and the fix, before a byte moves."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import sglangfns
from sglangfns import host_pool, import_sglang, slots

import_sglang()

from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

from pipeline.integrations.sglang.settings import settings  # noqa: E402

HASHES = [f"{i:02x}" * 32 for i in range(1, 4)]
SGLANG_UPPER = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"


def extra(storage: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The JSON of --hicache-storage-backend-extra-config, as a dict."""
    return {"interface_v1": 1, "storage": storage, **more}


def sglang_hashes(tokens: list[int]) -> list[str]:
    """SGLang's own page hashes of `tokens` (its `get_hash_str`, a native extension it builds
    on first use); where it cannot build here, SHA-256s in the same form (64 lowercase hex)."""
    try:
        found = get_hash_str(tokens, None, page_size=4)
    except RuntimeError:  # no compiler or libcrypto: the form, not SGLang's values
        return [hashlib.sha256(bytes(tokens[i : i + 4])).hexdigest() for i in range(0, 8, 4)]
    return found if isinstance(found, list) else [found]


def built(config: dict[str, Any]) -> Any:
    """The backend as SGLang's cache controller makes it, on an MLA host pool of 4 pages."""
    pool = host_pool("layer_first", True, page_num=4, page_size=4, layer_num=2)
    names = {"module_path": "pipeline.integrations.sglang", "class_name": "PipelineStorage"}
    return sglangfns.built({"backend_name": "hicache-pipeline", **names, **config}, pool)


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ({"direct_io": "false"}, 'storage.direct_io="false": true or false (a JSON boolean'),
        ({"direct_io": 0}, "storage.direct_io=0: true or false (a JSON boolean"),
        ({"io_threads": "4"}, 'storage.io_threads="4": a whole number (a JSON number'),
        ({"io_threads": 2.5}, "storage.io_threads=2.5: a whole number"),
        ({"io_threads": True}, "storage.io_threads=true: a whole number"),
        ({"path": 5}, 'storage.path=5: a string (e.g. "/srv/l3")'),
        ({"segment_bytes": "1GiB"}, 'storage.segment_bytes="1GiB": a whole number'),
        ({"evict_to": "0.5"}, 'storage.evict_to="0.5": a number'),
        ({"tenant": 7}, "storage.tenant=7: a string"),
        ({"capacity_bytes": [1]}, "storage.capacity_bytes=[1]: a size"),
    ],
)
def test_a_store_setting_of_the_wrong_json_type_is_refused(
    store: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as said:
        settings(extra({"kind": "file", "path": "/x", **store}))
    assert f"extra config: {message}" in str(said.value)


def test_a_store_setting_of_the_right_json_type_is_taken() -> None:
    store = {"kind": "file", "path": "/x", "direct_io": True, "io_threads": 2}
    store |= {"capacity_bytes": 1 << 30, "evict_to": 1, "auth_key_file": None}
    taken = settings(extra(store)).storage
    assert (taken.direct_io, taken.io_threads, taken.capacity, taken.evict_to) == (
        True,
        2,
        1 << 30,
        1,
    )
    assert settings(extra({"kind": "file", "path": "/x"}, interface_v1=True)).storage.path == "/x"


def test_io_threads_below_one_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"storage.io_threads=0 must be >= 1"):
        settings(extra({"kind": "file", "path": "/x", "io_threads": 0}))


@pytest.mark.parametrize("value", ["1", 2, 1.0, -1, "true"])
def test_interface_v1_is_exactly_0_or_1(value: Any) -> None:
    with pytest.raises(ValueError) as said:
        settings(extra({"kind": "file", "path": "/x"}, interface_v1=value))
    message = str(said.value)
    assert message.startswith(f"extra config: interface_v1={value!r}: ")
    assert '"interface_v1": 1' in message


def test_sglangs_own_hashes_are_keys_and_anything_else_is_refused(tmp_path: Path) -> None:
    backend = built(extra({"kind": "file", "path": str(tmp_path)}))
    real = sglang_hashes(list(range(8)))
    assert backend.batch_exists(real) == 0  # SGLang 0.5.23's own form: 64 hex digits
    not_hashes = {
        "k0": "k0",
        "short": "9f2c" * 4,
        "upper": SGLANG_UPPER,
        "suffixed": HASHES[0] + "_0_1",
    }
    for kind, key in not_hashes.items():
        for call in (backend.batch_exists, lambda k: backend.batch_set_v1(k, slots([1, 2], 4))):
            with pytest.raises(ValueError) as said:
                call([HASHES[1], key])
            message = str(said.value)
            assert message.startswith("hashes[1]="), (kind, message)
            assert "not an SGLang page hash (64 lowercase hex digits" in message, (kind, message)
    assert not list(tmp_path.rglob("*/*/*"))  # nothing written
    backend.close()


@pytest.mark.parametrize("kind", ["sparse", "meta"])
def test_sparse_or_meta_host_slots_are_refused_naming_them(tmp_path: Path, kind: str) -> None:
    backend = built(extra({"kind": "file", "path": str(tmp_path)}))
    good = slots([1, 2], 4)
    bad = good.to_sparse() if kind == "sparse" else good.to("meta")
    for call in (backend.batch_set_v1, backend.batch_get_v1):
        with pytest.raises(ValueError) as said:
            call(HASHES[:2], bad)
        message = str(said.value)
        assert message.startswith("host_indices must be a dense CPU int64 tensor of token slots")
        assert ("sparse_coo" if kind == "sparse" else "on meta") in message
    assert backend.batch_set_v1(HASHES[:2], good) == [True, True]
    assert backend.batch_get_v1(HASHES[:2], good) == [True, True]
    backend.close()


def test_cpu_int64_slots_of_another_width_still_move(tmp_path: Path) -> None:
    backend = built(extra({"kind": "file", "path": str(tmp_path)}))
    assert backend.batch_set_v1(HASHES[:1], slots([3], 4).int()) == [True]
    assert backend.batch_get_v1(HASHES[:1], slots([3], 4)) == [True]
    backend.close()
