"""The file store owns only what it made (issue 49): a bounded `run`, `store evict` and `store
verify --remove` (with a wrong key, and with the right key on a really damaged object) leave
every file a user planted in the store's folder byte for byte as it was, links and their
targets untouched; and a `.usage` or an object-looking file that is not the store's is never
written or removed."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import job_config
from l3fns import store_cli as cli

import pipeline
from pipeline.core.l3 import MAX_OBJECT_BYTES, namespace, object_bytes
from pipeline.engine.l3.stores import FileStore
from pipeline.engine.l3.stores.beneath import Beneath
from pipeline.jobs import store_verify

FOUR_HOURS_NS = 4 * 3600 * 10**9


def run(*overrides: str) -> subprocess.CompletedProcess:
    """`hicache-pipeline run OVERRIDES`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def old(path: Path) -> None:
    then = time.time_ns() - FOUR_HOURS_NS
    os.utime(path, ns=(then, then), follow_symlinks=False)


def plant(folder: Path, outside: Path) -> dict[Path, bytes]:
    """User files in the store's folder: at its top, inside a namespace and a prefix folder,
    hidden ones, old `.tmp-*` ones, an object-looking name, and links to files outside. The
    bytes of each regular file (links: their target's path)."""
    space = folder / "v3-bf16-p4-0123456789abcdef"
    prefix = space / "ab"
    real = folder / namespace(job_config().model)  # where the run writes its objects
    for made in (prefix, real / "00", folder / "docs"):
        made.mkdir(parents=True)
    files = {
        folder / "docs" / "thesis.txt": b"my thesis",
        folder / "notes.txt": b"notes",
        folder / ".bashrc": b"alias ll='ls -l'",
        folder / ".tmp-old": b"a user's old temporary file",
        space / "README": b"about this folder",
        space / ".tmp-0123456789abcdef": b"not in a prefix folder",
        prefix / ("ab" * 16): b"named like an object, no header",
        prefix / ".tmp-mine": b"a user's, not the store's name",
        prefix / "notes.txt": b"inside a prefix folder",
    }
    for path, data in files.items():
        path.write_bytes(data)
        old(path)
    target = outside / "secret.txt"
    target.write_bytes(b"outside the store")
    links = {folder / "link": target, prefix / ("cd" * 16): target, folder / "docs.link": outside}
    for link, to in links.items():
        link.symlink_to(to)
    return {**files, target: b"outside the store"}


def unchanged(planted: dict[Path, bytes], outside: Path, *, moved: Path, to: Path) -> None:
    """Every planted file byte for byte (those at `moved`'s top now below `to`), and the
    links as they were."""
    target = str(outside / "secret.txt")
    for path, data in planted.items():
        assert where(path, moved, to).read_bytes() == data, path
    space = moved / "v3-bf16-p4-0123456789abcdef"
    for link in (moved / "link", space / "ab" / ("cd" * 16)):
        assert os.readlink(where(link, moved, to)) == target
    assert os.readlink(where(moved / "docs.link", moved, to)) == str(outside)


def where(path: Path, moved: Path, to: Path) -> Path:
    """`path`, or where it went if it was at the top of `moved` and not a namespace folder."""
    if moved in path.parents and not path.relative_to(moved).parts[0].startswith("v"):
        return to / path.relative_to(moved)
    return path


def test_a_bounded_run_evict_and_verify_leave_every_planted_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder, outside, aside = tmp_path / "store", tmp_path / "outside", tmp_path / "aside"
    for made in (folder, outside, aside):
        made.mkdir()
    planted = plant(folder, outside)
    key, wrong = tmp_path / "key", tmp_path / "wrong"
    for path in (key, wrong):
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
    # a write-back of the default workload: 64 objects of 1458 B (108 KB, of 1528 B at most)
    store = ["storage=file", f"storage.path={folder}", "storage.capacity_bytes=160KiB"]
    done = run(*store, "workload.cycles=3", f"storage.auth_key_file={key}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "verified: bit-exact (2 ranks)" in done.stdout
    unchanged(planted, outside, moved=folder, to=folder)
    written = [
        p for p in folder.glob(f"{namespace(job_config().model)}/*/*") if p.stat().st_size > 1000
    ]
    assert 64 <= len(written) < 3 * 64  # evicted down to the capacity, one write-back kept
    assert max(p.stat().st_size for p in written) <= object_bytes(job_config().model)
    # the store commands refuse a folder with a user's files at its top, before any byte
    code, said = cli(capsys, "evict", str(folder), "--to", "0")
    assert code == 2 and "not a store's folder" in said["error"]
    for entry in list(folder.iterdir()):
        if not entry.name.startswith(("v", ".usage")):
            entry.rename(aside / entry.name)
    code, checked = cli(capsys, "verify", str(folder), f"storage.auth_key_file={wrong}", "--remove")
    assert code == 0 and (checked["removed"], checked["intact"], checked["corrupt"]) == (0, 0, [])
    assert len(checked["not_checked"]) == checked["objects"] > 0
    objects = [p for p in folder.glob("v*/*/*") if p.is_file() and p.stat().st_size > 1000]
    assert len(objects) == checked["objects"]  # none removed
    damaged = sorted(objects)[0]
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    code, checked = cli(capsys, "verify", str(folder), f"storage.auth_key_file={key}", "--remove")
    assert code == 0 and checked["removed"] == 1 and not damaged.exists()
    assert [c["name"] for c in checked["corrupt"]] == [str(damaged.relative_to(folder))]
    assert checked["intact"] == len(objects) - 1
    code, evicted = cli(capsys, "evict", str(folder), "--to", "0")
    assert code == 0 and evicted["objects"] == 0 and evicted["evicted_objects"] == len(objects) - 1
    unchanged(planted, outside, moved=folder, to=aside)


def write_objects(folder: Path, num_pages: int, *overrides: str) -> list[Path]:
    """Back up and write back `num_pages` pages of random KV through a real engine (one
    rank); the object files the folder then holds."""
    base = ["topology=tp1", "workload.num_tokens=32", "storage=file", f"storage.path={folder}"]
    engine = pipeline.create_engine(pipeline.compose([*base, *overrides]))
    try:
        for unit in engine.model.units:
            layer = engine.device_pool.layer(unit)
            layer[:num_pages] = torch.randn(layer[:num_pages].shape).to(layer.dtype)
        slots = torch.arange(num_pages * engine.sizing.slots_per_page)
        host = engine.host_slots.alloc(len(slots))
        engine.backup(host, slots).wait()
        engine.write_back(engine.l3_keys(list(range(len(slots)))), host).wait()
        while engine.acks.pending:
            engine.poll()
    finally:
        engine.close()
    return sorted(p for p in folder.glob("v*/*/*") if p.is_file())


def secret(path: Path) -> Path:
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


@pytest.mark.usefixtures("one_rank")
def test_verify_with_a_wrong_or_no_key_removes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    key, wrong = secret(tmp_path / "key"), secret(tmp_path / "wrong")
    objects = write_objects(folder, 4, f"storage.auth_key_file={key}")
    before = {p: p.read_bytes() for p in objects}
    for args in ([f"storage.auth_key_file={wrong}"], []):
        code, said = cli(capsys, "verify", str(folder), *args, "--remove")
        assert code == 0 and (said["intact"], said["removed"], said["corrupt"]) == (0, 0, [])
        reasons = {c["reason"] for c in said["not_checked"]}
        assert len(said["not_checked"]) == 4 and len(reasons) == 1, reasons
        assert reasons.pop().endswith("not checked" if args else "(give storage.auth_key_file=KEY)")
    assert {p: p.read_bytes() for p in objects} == before
    code, said = cli(capsys, "verify", str(folder), f"storage.auth_key_file={key}")
    assert code == 0 and said["intact"] == 4 and said["not_checked"] == []


@pytest.mark.usefixtures("one_rank")
def test_verify_reports_an_unreadable_object_and_removes_it_not(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = write_objects(tmp_path, 3)
    locked = objects[0]
    opened = Beneath.open

    def unreadable(self: Beneath, parts: list[str], flags: int, mode: int = 0) -> int:
        if parts and parts[-1] == locked.name:
            raise PermissionError(errno.EACCES, "Permission denied")
        return opened(self, parts, flags, mode)

    monkeypatch.setattr(Beneath, "open", unreadable)
    code, said = cli(capsys, "verify", str(tmp_path), "--remove")
    assert code == 0 and said["removed"] == 0 and said["intact"] == 2
    assert said["not_checked"] == [
        {"name": str(locked.relative_to(tmp_path)), "reason": "unreadable (Permission denied)"}
    ]
    assert locked.exists()


@pytest.mark.usefixtures("one_rank")
def test_verify_checks_every_byte_without_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No model named: a flipped payload byte is found from the header alone, read a piece
    at a time."""
    objects = write_objects(tmp_path, 3, "model=tiny_dsa")
    data = bytearray(objects[1].read_bytes())
    data[-700] ^= 0x10
    objects[1].write_bytes(bytes(data))
    monkeypatch.setattr(store_verify, "PIECE_BYTES", 64)
    read = os.pread
    sizes: list[int] = []

    def counted(fd: int, size: int, at: int) -> bytes:
        sizes.append(size)
        return read(fd, size, at)

    monkeypatch.setattr(os, "pread", counted)
    code, said = cli(capsys, "verify", str(tmp_path))
    assert code == 1 and said["intact"] == 2 and said["not_checked"] == []
    ((corrupt),) = said["corrupt"]
    assert corrupt["name"] == str(objects[1].relative_to(tmp_path))
    assert re.fullmatch(r"unit \d+ \(\d+ B at byte \d+\) does not check", corrupt["reason"])
    assert max(sizes) <= 64 + 200  # the header's names, then pieces


def test_a_file_larger_than_any_object_is_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    name = f"v3-bf16-p4-{'0' * 16}/ab/{'ab' * 16}"
    huge = tmp_path / name
    huge.parent.mkdir(parents=True)
    with huge.open("wb") as f:
        f.write(b"HCPL3")
        f.truncate(MAX_OBJECT_BYTES + 1)  # sparse: nothing on disk
    for action in (["verify", "--remove"], ["stats"], ["evict", "--to", "0"]):
        code, said = cli(capsys, action[0], str(tmp_path), *action[1:])
        assert code == 0 and said["left_alone"] == [
            f"{name}: larger than any object: not an object of this store"
        ], action
    assert huge.stat().st_size == MAX_OBJECT_BYTES + 1


@pytest.mark.usefixtures("one_rank")
def test_an_unreadable_folder_is_passed_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = write_objects(tmp_path, 4)
    shut = objects[0].parent
    scandir = os.scandir

    def unreadable(fd: int) -> Any:
        if isinstance(fd, int) and os.readlink(f"/proc/self/fd/{fd}") == str(shut):
            raise PermissionError(errno.EACCES, "Permission denied")
        return scandir(fd)

    monkeypatch.setattr(os, "scandir", unreadable)
    note = f"{shut.relative_to(tmp_path)}: not read (Permission denied)"
    inside = len([p for p in objects if p.parent == shut])
    for action in (["stats"], ["verify", "--remove"], ["evict", "--to", "0"]):
        code, said = cli(capsys, action[0], str(tmp_path), *action[1:])
        assert code == 0 and said["left_alone"] == [note], action
    assert said["evicted_objects"] == 4 - inside
    store = FileStore(str(tmp_path), capacity_bytes=1 << 20)  # a bounded run's store
    assert store.stats()["objects"] == 0
    store.close()
    assert all(p.exists() for p in objects if p.parent == shut)


@pytest.mark.parametrize("planted", ["link", "folder", "foreign", "empty"])
def test_a_ledger_that_is_not_the_stores_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, planted: str
) -> None:
    (tmp_path / f"v3-bf16-p4-{'0' * 16}").mkdir()
    ledger = tmp_path / ".usage"
    if planted == "link":
        (tmp_path.parent / "elsewhere").write_bytes(b"")
        ledger.symlink_to(tmp_path.parent / "elsewhere")
    elif planted == "folder":
        ledger.mkdir()
    else:
        ledger.write_bytes(b"" if planted == "empty" else b"disk usage notes, mine")
    kept = None if planted in ("link", "folder") else ledger.read_bytes()
    for action in (["stats"], ["verify", "--remove"], ["evict", "--to", "0"]):
        code, said = cli(capsys, action[0], str(tmp_path), *action[1:])
        assert code == 2 and f"{tmp_path}: .usage" in said["error"], (action, said)
        assert "\n" not in said["error"]
    if kept is not None:
        assert ledger.read_bytes() == kept


def test_a_folder_of_hidden_names_only_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / ".tmp-12345678").write_bytes(b"x")
    old(tmp_path / ".tmp-12345678")
    (tmp_path / ".cache").mkdir()
    for action in (["stats"], ["verify", "--remove"], ["evict", "--to", "0"]):
        code, said = cli(capsys, action[0], str(tmp_path), *action[1:])
        assert code == 2 and "not a store's folder (it holds .cache, .tmp-12345678" in said["error"]
    assert (tmp_path / ".tmp-12345678").read_bytes() == b"x"
    assert not (tmp_path / ".usage").exists()
    empty = tmp_path / ".cache"
    code, said = cli(capsys, "evict", str(empty), "--to", "0")
    assert code == 2 and "it holds no namespace folder" in said["error"]
    assert list(empty.iterdir()) == []


def test_a_run_whose_write_back_cannot_fit_fails_naming_the_capacity(tmp_path: Path) -> None:
    """Below one write-back's worth, a write-back keeps its prefix's head and fails (or the
    config is refused), naming storage.capacity_bytes; it never evicts its own head."""
    store = ["storage=file", f"storage.path={tmp_path}", "storage.capacity_bytes=64KiB"]
    done = run(*store, "workload.cycles=1")
    assert done.returncode != 0 and "storage.capacity_bytes" in done.stderr
    assert "verified: bit-exact" not in done.stdout
