"""A bounded file store's capacity works or is refused, its lock waits are bounded and named,
a failed open leaves no descriptor behind, and a key file must be a secret (issue 49)."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import struct
from pathlib import Path

import pytest

from pipeline.cli.main import main
from pipeline.core.storage import StorageConfig, StorageKind
from pipeline.engine.l3.stores import FileStore, open_store
from pipeline.engine.l3.stores.files import read_key_file

SPACE = "v3-bf16-p4-0123456789abcdef"
SIZE = 4096


def name_of(i: int) -> str:
    key = f"{i:032x}"[::-1]
    return f"{SPACE}/{key[:2]}/{key}"


def blob(name: str, size: int = SIZE) -> bytes:
    """An object's bytes as far as ownership goes: a header that names it, then filler."""
    ns, nm = SPACE.encode(), name.encode()
    head = struct.pack("<5sHHHBIQ16s", b"HCPL3", 3, len(ns), len(nm), 0, 0, 0, bytes(16))
    head += ns + nm
    return head + bytes(size - len(head))


def put(store: FileStore, i: int, size: int = SIZE) -> None:
    store.put(name_of(i), [blob(name_of(i), size)])


def present(root: Path, i: int) -> bool:
    return (root / name_of(i)).exists()


def test_a_capacity_below_one_write_back_names_the_minimum() -> None:
    config = StorageConfig(kind=StorageKind.file, capacity_bytes="64KiB")
    said = config.capacity_problem(1458, 64)
    assert said is not None and said.startswith("storage.capacity_bytes=64KiB: one write-back")
    assert said.endswith("raise it to at least 103680 B")  # 64 x 1458 / 0.9
    assert config.capacity_problem(1458, 40) is None


def test_a_capacity_above_the_free_disk_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"storage.capacity_bytes=\d+: more than the folder"):
        FileStore(str(tmp_path), capacity_bytes=10**17)
    assert list(tmp_path.iterdir()) == []  # no ledger left saying so


def test_a_write_back_never_evicts_its_own_objects(tmp_path: Path) -> None:
    """Names asked about in one `exists` call (as a write-back does first) are kept: once
    they alone fill the capacity, a put of the same write-back fails instead."""
    store = FileStore(str(tmp_path), capacity_bytes=4 * SIZE, evict_to=1.0)
    first = [name_of(i) for i in range(6)]
    store.exists(first)
    for i in range(4):
        put(store, i)
    with pytest.raises(OSError, match=r"storage.capacity_bytes=16384: the objects this write"):
        put(store, 4)
    assert [present(tmp_path, i) for i in range(5)] == [True] * 4 + [False]
    store.exists([name_of(i) for i in range(10, 14)])  # the next write-back: LRU again
    for i in range(10, 14):
        put(store, i)
    assert [present(tmp_path, i) for i in (0, 1, 2, 3, 10, 13)] == [False] * 4 + [True] * 2
    store.close()


def test_a_full_disk_evicts_and_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(str(tmp_path), capacity_bytes=8 * SIZE, evict_to=0.5)
    for i in range(6):
        put(store, i)
    full = [True]
    writev = os.writev

    def disk_full_once(fd: int, buffers: list) -> int:
        if full.pop() if full else False:
            raise OSError(errno.ENOSPC, "No space left on device")
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", disk_full_once)
    put(store, 6)
    assert present(tmp_path, 6) and (store.stats()["evictions"] or 0) > 0
    store.close()


def test_an_object_that_cannot_be_removed_is_skipped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An object larger than the capacity (the newest) that cannot go is left out of the
    count, said once; only the least recently used others that must go, go."""
    store = FileStore(str(tmp_path), capacity_bytes=8 * SIZE, evict_to=0.9)
    for i in range(8):
        put(store, i)
    stuck = name_of(99)
    (tmp_path / stuck).parent.mkdir(exist_ok=True)
    (tmp_path / stuck).write_bytes(blob(stuck, 12 * SIZE))
    unlink = os.unlink

    def refuse(path: str, *, dir_fd: int | None = None) -> None:
        if path == stuck.rsplit("/", 1)[1]:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", refuse)
    with caplog.at_level(logging.WARNING, logger="hicache-pipeline"):
        put(store, 8)  # past the capacity: an eviction pass
        put(store, 9)
        put(store, 10)  # another pass
    assert [present(tmp_path, i) for i in (0, 1, 2, 3, 4, 10, 99)] == [False] * 4 + [True] * 3
    assert caplog.text.count(f"cannot remove {stuck}") == 1
    assert store.stats()["bytes"] == 7 * SIZE
    store.close()


def test_a_store_without_a_capacity_keeps_the_ledgers(tmp_path: Path) -> None:
    bounded = FileStore(str(tmp_path), capacity_bytes=4 * SIZE, evict_to=0.5)
    bounded.close()
    second = FileStore(str(tmp_path))  # no storage.capacity_bytes: the ledger's
    for i in range(12):
        put(second, i)
    assert second.capacity_bytes == 4 * SIZE
    held = sum(p.stat().st_size for p in tmp_path.glob("v3-*/*/*"))
    assert held <= 4 * SIZE and second.stats()["bytes"] == held
    second.close()


def test_a_held_lock_is_a_named_error_after_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    FileStore(str(tmp_path), capacity_bytes=1 << 20).close()
    holder = os.open(tmp_path / ".usage", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        message = (
            f"the file store's lock on {tmp_path}/.usage is held by another process for "
            "0.2 s; raise runtime.timeout_s or stop that process"
        )
        with pytest.raises(TimeoutError, match=re.escape(message)):
            FileStore(str(tmp_path), capacity_bytes=1 << 20, timeout_s=0.2)
        config = StorageConfig(kind=StorageKind.file, path=str(tmp_path), capacity_bytes="1MiB")
        with pytest.raises(TimeoutError, match=re.escape(message)):
            open_store(config, 4096, timeout_s=0.2)
        (tmp_path / SPACE).mkdir()
        args = ["store", "evict", str(tmp_path), "--to", "0", "runtime.timeout_s=0.2", "--json"]
        with pytest.raises(SystemExit) as exited:
            main(args)
        said = json.loads(capsys.readouterr().out)
        assert exited.value.code == 2 and said["error"] == message
    finally:
        os.close(holder)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("planted", ["fifo", "folder", "link", "foreign"])
def test_a_failed_open_leaves_no_descriptor(tmp_path: Path, planted: str) -> None:
    ledger = tmp_path / ".usage"
    if planted == "fifo":
        os.mkfifo(ledger)
    elif planted == "folder":
        ledger.mkdir()
    elif planted == "link":
        (tmp_path / "elsewhere").write_bytes(b"")
        ledger.symlink_to(tmp_path / "elsewhere")
    else:
        ledger.write_bytes(b"my usage notes")
    before = open_fds()
    with pytest.raises(ValueError, match=f"storage.path={tmp_path}: .usage"):
        FileStore(str(tmp_path), capacity_bytes=1 << 20)
    assert open_fds() == before
    if planted == "foreign":
        assert ledger.read_bytes() == b"my usage notes"


@pytest.mark.parametrize(
    ("mode", "key", "message"),
    [
        (0o644, os.urandom(32), "its group or others may read or write it (mode 0644); chmod 600"),
        (0o620, os.urandom(32), "(mode 0620); chmod 600"),
        (0o600, bytes(32), "not a secret (1 distinct byte values in 32)"),
        (0o400, b"hunter2" * 4, "not a secret (7 distinct byte values in 28)"),
    ],
    ids=["world-readable", "group-writable", "zeros", "passphrase"],
)
def test_a_key_file_must_be_the_owners_and_a_secret(
    tmp_path: Path, mode: int, key: bytes, message: str
) -> None:
    path = tmp_path / "key"
    path.write_bytes(key)
    path.chmod(mode)
    with pytest.raises(ValueError, match=re.escape(f"storage.auth_key_file={path}: ")) as said:
        read_key_file(str(path))
    assert message in str(said.value)


def test_a_private_random_key_is_read(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(key := os.urandom(32))
    path.chmod(0o400)
    assert read_key_file(str(path)) == key
