"""`hicache-pipeline store stats|verify|evict` on a real file store that a real engine wrote:
what it counts, each kind of damage verify finds (and removes only those), least recently
used objects evicted first, and wrong folders refused before a byte is read or removed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from l3fns import store_cli as cli

import pipeline
from pipeline.engine.l3.stores import FileStore
from pipeline.engine.l3.stores.owned import walk

pytestmark = pytest.mark.usefixtures("one_rank")


def write_prefixes(folder: Path, num_pages: int, *overrides: str) -> list[str]:
    """Back up and write back `num_pages` pages of random KV through a real engine; the
    names of every object the folder then holds."""
    base = ["topology=tp1", "workload.num_tokens=32", "storage=file", f"storage.path={folder}"]
    job = pipeline.compose([*base, *overrides])
    engine = pipeline.create_engine(job)
    try:
        for unit in engine.model.units:
            layer = engine.device_pool.layer(unit)
            layer[:num_pages] = torch.randn(layer[:num_pages].shape).to(layer.dtype)
        slots = torch.arange(num_pages * engine.sizing.slots_per_page)
        host = engine.host_slots.alloc(len(slots))
        engine.backup(host, slots).wait()
        keys = engine.l3_keys(list(range(len(slots))))
        engine.write_back(keys, host).wait()
        while engine.acks.pending:
            engine.poll()
    finally:
        engine.close()
    return [s.name for s in stored(folder)]


def stored(folder: Path) -> Iterator:
    store = FileStore(str(folder))
    try:
        yield from walk(store.beneath)
    finally:
        store.close()


def flip(path: Path, at: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[at] ^= 0x40
    path.write_bytes(bytes(blob))


def test_stats_counts_objects_and_bytes_per_namespace(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_prefixes(tmp_path, 3)
    names = write_prefixes(tmp_path, 2, "model=tiny_dsa")
    code, stats = cli(capsys, "stats", str(tmp_path))
    assert code == 0 and stats["objects"] == 5 and stats["ledger"] is None  # unbounded
    assert stats["bytes"] == sum((tmp_path / n).stat().st_size for n in names)
    spaces = stats["namespaces"]
    assert sorted(s["objects"] for s in spaces.values()) == [2, 3] and len(spaces) == 2


def test_verify_finds_each_kind_of_damage_and_removes_only_those(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every byte checked from the header alone (no model named); a file whose header names
    another object is not this object: left alone, never removed."""
    names = write_prefixes(tmp_path, 6)
    assert cli(capsys, "verify", str(tmp_path))[1]["intact"] == 6
    payload, header, short, moved = (tmp_path / n for n in names[:4])
    flip(payload, -3)  # the last unit's bytes
    flip(header, 26)  # the header's own digest
    short.write_bytes(short.read_bytes()[:-1])
    moved.write_bytes((tmp_path / names[5]).read_bytes())  # another object's bytes
    code, found = cli(capsys, "verify", str(tmp_path))
    reasons = {c["name"]: c["reason"] for c in found["corrupt"]}
    assert code == 1 and found["objects"] == 5 and found["intact"] == 2
    assert re.fullmatch(r"unit 4 \(\d+ B at byte \d+\) does not check", reasons[names[0]])
    assert reasons[names[1]] == "its header does not check (damaged)"
    assert re.fullmatch(r"\d+ bytes where its header says \d+", reasons[names[2]])
    assert found["left_alone"] == [f"{names[3]}: no header naming it: not an object of this store"]
    code, removed = cli(capsys, "verify", str(tmp_path), "--remove")
    assert code == 0 and removed["removed"] == 3
    assert sorted(s.name for s in stored(tmp_path)) == sorted(names[4:])
    assert moved.read_bytes() == (tmp_path / names[5]).read_bytes()
    code, clean = cli(capsys, "verify", str(tmp_path))
    assert code == 0 and (clean["objects"], clean["intact"], clean["corrupt"]) == (2, 2, [])


def test_keyed_objects_are_checked_with_the_key_and_not_without(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    folder = tmp_path / "store"
    folder.mkdir()
    names = write_prefixes(folder, 2, f"storage.auth_key_file={key}")
    code, without = cli(capsys, "verify", str(folder))
    assert code == 0 and without["intact"] == 0
    assert [s["reason"] for s in without["not_checked"]] == [
        "keyed: not checked (give storage.auth_key_file=KEY)"
    ] * 2
    flip(folder / names[0], -1)
    code, keyed = cli(capsys, "verify", str(folder), f"storage.auth_key_file={key}")
    assert code == 1 and keyed["intact"] == 1 and keyed["not_checked"] == []
    assert [c["name"] for c in keyed["corrupt"]] == [names[0]]


def test_evict_removes_the_least_recently_used_first(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    names = write_prefixes(tmp_path, 6)
    size = (tmp_path / names[0]).stat().st_size
    store = FileStore(str(tmp_path))
    read = [names[1], names[4]]
    assert all(store.get(name) is not None for name in read)  # a read is a use
    store.close()
    code, done = cli(capsys, "evict", str(tmp_path), "--to", str(2 * size))
    assert code == 0 and (done["evicted_objects"], done["objects"]) == (4, 2)
    assert sorted(s.name for s in stored(tmp_path)) == sorted(read)
    after = cli(capsys, "stats", str(tmp_path))[1]
    assert after["objects"] == 2 and after["ledger"] is None  # no ledger made: not bounded


def test_a_wrong_folder_is_refused_before_a_byte_moves(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    write_prefixes(store, 1)
    (tmp_path / "link").symlink_to(store)
    (tmp_path / "file").write_bytes(b"")
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_bytes(b"mine")
    cases = {
        "missing": "no such folder",
        "file": "not a folder",
        "link": "a symbolic link; name the store's folder itself",
        "home": "not a store's folder (it holds notes.txt;",
    }
    for name, message in cases.items():
        for args in (["verify", "--remove"], ["evict", "--to", "0"], ["stats"]):
            code, said = cli(capsys, args[0], str(tmp_path / name), *args[1:])
            assert code == 2 and message in said["error"], (name, args)
    assert (home / "notes.txt").read_bytes() == b"mine" and len(list(stored(store))) == 1
    for args, message in [
        (["evict", str(store)], "--to BYTES goes with evict"),
        (["stats", str(store), "--to", "1GiB"], "--to BYTES goes with evict"),
        (["evict", str(store), "--to", "lots"], "--to 'lots': a size in bytes"),
        (["tidy", str(store)], "tidy action; one of stats, verify, evict"),
        (["stats"], "name the store's folder"),
        (["stats", str(store), "model=tiny_dsa"], "overrides go with verify"),
    ]:
        code, said = cli(capsys, *args)
        assert code == 2 and message in said["error"], args
