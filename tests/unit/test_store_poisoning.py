"""A bad object at a page's name never blocks that page (issue 62): a write-back, the engine's
or SGLang's `batch_set_v1`, keeps only an object a load would read whole and writes over
anything else at the name (a flipped byte in the header or in a unit, a truncated or empty
file, a FIFO, an unkeyed object under a key, a link to a file outside the store, which stays as
it was), so the page then loads back bit-exact, while the intact objects beside it are not
rewritten; a folder at the name is an error naming it; and `store verify --remove` under a key
removes the objects the key does not authenticate, and nothing that is not the store's."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import MOONCAKE
from l3fns import store_cli as cli
from sglangfns import host_pool, import_sglang, slots

import pipeline
from pipeline.core.l3 import Checks, PageObject, digest, header
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot

CASES = ("header", "unit", "truncated", "empty", "fifo", "unkeyed", "symlink")
PAGES = 3
SPOILED = 1
"""The page whose object is spoiled: were it kept, a load would stop before it."""
HASHES = [f"{i:02x}" * 32 for i in range(1, PAGES + 1)]
"""SGLang's hashes of a 3-page prefix."""


def key_file(path: Path) -> str:
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


def unkeyed(data: bytes, obj: PageObject, space: str, name: str, head_bytes: int) -> bytes:
    """The keyed object `data` made again without a key: its payload under a CRC-32C header
    (what a store held before `storage.auth_key_file` was turned on)."""
    payload, units, at = data[head_bytes:], [], 0
    for unit in obj.units:
        units.append(payload[at : at + unit.page_bytes])
        at += unit.page_bytes
    lengths = [len(u) for u in units]
    return header(space, name, [digest(u) for u in units], lengths, Checks()) + payload


def flipped(data: bytes, at: int) -> bytes:
    spoiled = bytearray(data)
    spoiled[at] ^= 0x40
    return bytes(spoiled)


def spoil(path: Path, case: str, head_bytes: int, remade: bytes, outside: Path) -> None:
    """Put `case` in the place of the intact object at `path` (`remade`: it unkeyed; a link
    points at `outside`, which then holds the intact object's bytes)."""
    data = path.read_bytes()
    path.unlink()
    if case == "fifo":
        os.mkfifo(path)
    elif case == "symlink":
        outside.write_bytes(data)
        path.symlink_to(outside)
    else:
        path.write_bytes(
            {
                "header": flipped(data, head_bytes - 1),  # its digest table's last byte
                "unit": flipped(data, head_bytes + 5),
                "truncated": data[: len(data) // 2],
                "empty": b"",
                "unkeyed": remade,
            }[case]
        )


def identity(paths: list[Path]) -> list[tuple[int, int]]:
    """Each file's inode and modification time: what a rewrite changes."""
    return [(p.lstat().st_ino, p.lstat().st_mtime_ns) for p in paths]


def replaced(paths: list[Path], before: list[tuple[int, int]], outside: Path, data: bytes) -> None:
    """The spoiled page's name holds a regular file again, a link's target is as it was, and
    every other object is the very file it was (not rewritten)."""
    assert stat.S_ISREG(paths[SPOILED].lstat().st_mode)
    assert not outside.exists() or outside.read_bytes() == data
    others = [i for i in range(PAGES) if i != SPOILED]
    assert identity([paths[i] for i in others]) == [before[i] for i in others]


@contextlib.contextmanager
def engine_on(folder: Path, *more: str) -> Iterator[Engine]:
    """One CPU rank over the file store at `folder`; layer_first: unkeyed write-backs go in one
    native call (`_fileio.write_objects`), keyed ones a page a `put`."""
    base = ["topology=tp1", "workload.num_tokens=32", "topology.mem_layout=layer_first"]
    folder.mkdir(exist_ok=True)
    job = pipeline.compose([*base, "storage=file", f"storage.path={folder}", *more])
    engine = pipeline.create_engine(job)
    try:
        yield engine
    finally:
        engine.close()


def written_back(engine: Engine, keys: list[str], host: torch.Tensor) -> None:
    engine.write_back(keys, host).wait()
    while engine.acks.pending:
        engine.poll()


def stored_pages(engine: Engine, first_token: int = 0) -> tuple[list[str], torch.Tensor, dict]:
    """PAGES pages of random KV backed up and written back: their keys, host slots, bytes."""
    size, pages = engine.sizing.slots_per_page, list(range(PAGES))
    fill_random(engine, pages, 7)
    host = engine.host_slots.alloc(PAGES * size)
    engine.backup(host, page_tokens(pages, size)).wait()
    keys = engine.l3_keys(list(range(first_token, first_token + PAGES * size)))
    written_back(engine, keys, host)
    return keys, host, snapshot(engine, pages)


def loaded_back(engine: Engine, keys: list[str], expected: dict) -> tuple[int, str]:
    """Pages loaded from L3 into poisoned device pages, and the first byte that differs."""
    size, target = engine.sizing.slots_per_page, [p + 8 for p in range(PAGES)]
    poison(engine, target)
    fresh = engine.host_slots.alloc(PAGES * size)
    loaded = engine.load_from_l3(keys, fresh, page_tokens(target, size))
    if loaded.handle is not None:
        loaded.handle.done().wait()
    while engine.acks.pending:
        engine.poll()
    hits = loaded.hits
    return hits, first_mismatch(engine, target[:hits], {u: e[:hits] for u, e in expected.items()})


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("case", CASES)
def test_an_engine_write_back_replaces_what_is_not_intact(case: str, tmp_path: Path) -> None:
    keyed = [f"storage.auth_key_file={key_file(tmp_path / 'key')}"] if case == "unkeyed" else []
    folder, outside = tmp_path / "store", tmp_path / "outside"
    with engine_on(folder, *keyed) as engine:
        keys, host, expected = stored_pages(engine)
        tier = engine.l3
        assert tier is not None
        names = [tier.name(k) for k in keys]
        paths = [folder / name for name in names]
        before, data = identity(paths), paths[SPOILED].read_bytes()
        head = tier.object.header_size(tier.space, names[SPOILED], tier.checks)
        remade = unkeyed(data, tier.object, tier.space, names[SPOILED], head)
        spoil(paths[SPOILED], case, head, remade, outside)
        written_back(engine, keys, host)
        assert loaded_back(engine, keys, expected) == (PAGES, "")
    replaced(paths, before, outside, data)
    assert paths[SPOILED].read_bytes() == data  # the page's own object, as first written


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("bound", [[], ["storage.capacity_bytes=1MiB"]], ids=["native", "bounded"])
def test_an_engine_write_back_names_a_folder_in_the_way(bound: list[str], tmp_path: Path) -> None:
    with engine_on(tmp_path, *bound) as engine:
        keys, host, _ = stored_pages(engine)
        assert engine.l3 is not None
        blocked = tmp_path / engine.l3.name(keys[SPOILED])
        blocked.unlink()
        blocked.mkdir()
        message = re.escape(str(blocked)) + " is a folder"
        with pytest.raises((OSError, RuntimeError), match=message):
            written_back(engine, keys, host)
    assert blocked.is_dir() and not blocked.is_symlink()


def built(storage: dict[str, Any], pool: Any) -> Any:
    """SGLang's backend over `storage`, made by its own factory, then given the host pool."""
    import_sglang()
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra: dict[str, Any] = {"module_path": "pipeline.integrations.sglang"}
    extra |= {"class_name": "PipelineStorage", "backend_name": "hicache-pipeline"}
    extra |= {"interface_v1": 1, "storage": storage}
    ranks = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1)
    flags = dict(is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=False)
    config = HiCacheStorageConfig(**ranks, **flags, model_name="org/model", extra_config=extra)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    return backend


@contextlib.contextmanager
def sglang_on(storage: dict[str, Any]) -> Iterator[tuple[Any, Any, list[str]]]:
    """The backend with PAGES pages written from host pages 0-2: (it, its pool, the names)."""
    pool = host_pool("layer_first", True, page_num=8, page_size=4, layer_num=3)
    pool.fill(seed=9)
    backend = built(storage, pool)
    try:
        assert backend.batch_set_v1(HASHES, slots([0, 1, 2], 4)) == [True] * PAGES
        yield backend, pool, [backend.io.name(k) for k in backend._keys(HASHES)]
    finally:
        backend.close()


def read_back_exact(backend: Any, pool: Any) -> None:
    """Every page loads back into other host pages (zeroed first) bit-exact."""
    pool.kv_buffer[:, 20:].zero_()  # layer_first: [layer, slot, 1, row]; pages 5-7
    assert backend.batch_get_v1(HASHES, slots([5, 6, 7], 4)) == [True] * PAGES
    for mine, theirs in zip([5, 6, 7], [0, 1, 2], strict=True):
        assert torch.equal(pool.layer_rows(mine), pool.layer_rows(theirs))


@pytest.mark.parametrize("case", CASES)
def test_sglang_batch_set_replaces_what_is_not_intact(case: str, tmp_path: Path) -> None:
    keyed = {"auth_key_file": key_file(tmp_path / "key")} if case == "unkeyed" else {}
    folder, outside = tmp_path / "store", tmp_path / "outside"
    with sglang_on({"kind": "file", "path": str(folder), **keyed}) as (backend, pool, names):
        io, paths = backend.io, [folder / name for name in names]
        before, data = identity(paths), paths[SPOILED].read_bytes()
        head = io.size - io.object.page_bytes
        remade = unkeyed(data, io.object, io.space, names[SPOILED], head)
        spoil(paths[SPOILED], case, head, remade, outside)
        assert backend.batch_set_v1(HASHES, slots([0, 1, 2], 4)) == [True] * PAGES
        assert backend.counts()["writes"] == PAGES + 1  # the spoiled page's alone
        read_back_exact(backend, pool)
    replaced(paths, before, outside, data)


def test_sglang_batch_set_names_a_folder_in_the_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sglang_on({"kind": "file", "path": str(tmp_path)}) as (backend, _, names):
        blocked = tmp_path / names[SPOILED]
        blocked.unlink()
        blocked.mkdir()
        with caplog.at_level(logging.WARNING, logger="hicache-pipeline"):
            assert backend.batch_set_v1(HASHES, slots([0, 1, 2], 4)) == [True, False, True]
    assert f"{blocked} is a folder" in caplog.text
    assert blocked.is_dir()


@pytest.mark.parametrize("store", ["file", MOONCAKE])
@pytest.mark.parametrize("case", ["unit", "truncated"])
def test_mooncake_and_file_keep_no_damaged_object(
    case: str, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Through the store's own put (Mooncake has no folder to plant in): the same rule."""
    storage: dict[str, Any] = {"kind": "file", "path": str(tmp_path)}
    if store == "mooncake":
        given = request.getfixturevalue("mooncake")
        storage = {"kind": "mooncake", "master": given.master, "segment_bytes": 32 << 20}
        storage["metadata_server"] = given.metadata_server
    with sglang_on(storage) as (backend, pool, names):
        io = backend.io
        data = io.store.get(names[SPOILED])
        head = io.size - io.object.page_bytes
        bad = flipped(data, head + 5) if case == "unit" else data[: len(data) // 2]
        io.store.put(names[SPOILED], [bad])
        written = backend.counts()["writes"]
        assert backend.batch_set_v1(HASHES, slots([0, 1, 2], 4)) == [True] * PAGES
        assert backend.counts()["writes"] == written + 1
        read_back_exact(backend, pool)


@pytest.mark.usefixtures("one_rank")
def test_verify_remove_under_a_key_removes_its_unkeyed_objects_only(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, key = tmp_path / "store", key_file(tmp_path / "key")
    with engine_on(folder) as engine:  # before the store was keyed
        stored_pages(engine)
    plain = sorted(p for p in folder.glob("v*/*/*"))
    verify = ["verify", str(folder), f"storage.auth_key_file={key}"]
    code, said = cli(capsys, *verify, "--remove")  # no object proves the key: none removed
    assert code == 0 and said["removed"] == 0 and len(said["not_checked"]) == PAGES
    with engine_on(folder, f"storage.auth_key_file={key}") as engine:
        stored_pages(engine, first_token=1000)  # another prefix: its own names
    keyed = {p: p.read_bytes() for p in folder.glob("v*/*/*") if p not in plain}
    space, prefix = plain[0].parents[1], plain[0].parent
    planted = [space / "notes.txt", prefix / ".hidden", prefix / (prefix.name + "0" * 30)]
    for path in planted:
        path.write_bytes(b"a user's file, not an object")
    code, said = cli(capsys, *verify)
    assert code == 1 and [c["name"] for c in said["corrupt"]] == [
        str(p.relative_to(folder)) for p in plain
    ]
    assert {c["reason"] for c in said["corrupt"]} == {
        "unkeyed: the key given (storage.auth_key_file) does not authenticate it"
    }
    code, said = cli(capsys, *verify, "--remove")
    assert code == 0 and said["removed"] == PAGES and said["intact"] == len(keyed) == PAGES
    assert not any(p.exists() for p in plain)
    assert {p: p.read_bytes() for p in folder.glob("v*/*/*") if p not in planted} == keyed
    assert all(p.read_bytes() == b"a user's file, not an object" for p in planted)
