"""A bounded file store's ledger (`.usage` in its folder): the bytes and objects the folder
holds and the capacity they are bounded by, and the file every writer locks. It is written
only where it is the store's own: made whole under a temporary name and linked into place (so
no process ever sees it empty), or found starting with the ledger's magic. Anything else
named `.usage` is refused, never written.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import struct
from dataclasses import dataclass

from pipeline.engine.l3.stores.beneath import Beneath

LEDGER = ".usage"
"""The ledger, and the lock, in the store's root: a hidden name, so no object's."""
LEDGER_FORMAT = struct.Struct("<8sqqq")
"""Its magic, then the bytes and the number of objects the folder holds, and its capacity."""
LEDGER_MAGIC = b"HCPLUSE2"
OLD_LEDGER_MAGIC = b"HCPLUSE1"
"""A ledger before the capacity was kept in it (bytes and objects only): still the store's."""
MAKING = ".usage-"
"""A ledger being made (16 hex digits follow), linked to `LEDGER` once whole."""
NOT_OURS = (
    "remove or move it away (a bounded store makes its own ledger there), or name another folder"
)
"""What to do about a `.usage` that is not the store's ledger: it is never written over."""


@dataclass(frozen=True)
class Ledger:
    """What a ledger says."""

    bytes: int
    objects: int
    capacity: int
    """The capacity the folder is bounded by (0: not said, an old ledger)."""


def read_ledger(fd: int) -> Ledger | None:
    """What the ledger open at `fd` says; None where it does not start with a ledger's magic."""
    raw = os.pread(fd, LEDGER_FORMAT.size, 0)
    if raw[:8] == OLD_LEDGER_MAGIC and len(raw) >= 24:
        _, held_bytes, held_objects = struct.unpack_from("<8sqq", raw)
        return Ledger(max(held_bytes, 0), max(held_objects, 0), 0)
    if raw[:8] != LEDGER_MAGIC or len(raw) != LEDGER_FORMAT.size:
        return None
    _, held_bytes, held_objects, capacity = LEDGER_FORMAT.unpack(raw)
    return Ledger(max(held_bytes, 0), max(held_objects, 0), max(capacity, 0))


def write_ledger(fd: int, ledger: Ledger) -> None:
    os.pwrite(fd, pack(ledger), 0)


def pack(ledger: Ledger) -> bytes:
    return LEDGER_FORMAT.pack(LEDGER_MAGIC, ledger.bytes, ledger.objects, ledger.capacity)


def open_ledger(beneath: Beneath, path: str, capacity: int) -> int:
    """A descriptor of the folder's ledger for reads and writes, made (empty, bounded by
    `capacity`) where there is none; ValueError naming the path where `.usage` is not this
    store's ledger (a link, a folder, another file)."""
    try:
        try:
            fd = beneath.open([LEDGER], os.O_RDWR | os.O_NONBLOCK)
        except FileNotFoundError:
            _make(beneath, capacity)
            fd = beneath.open([LEDGER], os.O_RDWR | os.O_NONBLOCK)
    except OSError as e:
        raise ValueError(not_ours(path, str(e.strerror))) from e
    try:
        check_ledger(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def not_ours(path: str, why: str) -> str:
    """The error for a `.usage` in the folder at `path` that is not the store's ledger."""
    said = f"storage.path={path}: {LEDGER} in the folder is not this store's ledger ({why})"
    return f"{said}: {NOT_OURS}"


def check_ledger(fd: int, path: str) -> None:
    """ValueError unless `fd` is a regular file that starts as a ledger does."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError(not_ours(path, "not a regular file"))
    if read_ledger(fd) is None:
        raise ValueError(not_ours(path, "a file of someone else's"))


def check_ledger_at(folder: Beneath, path: str) -> None:
    """ValueError where the folder holds a `.usage` that is not the store's ledger (a link, a
    folder, a user's file); none at all is fine (a bounded store makes one)."""
    try:
        fd = folder.open([LEDGER], os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ValueError(not_ours(path, str(e.strerror))) from e
    try:
        check_ledger(fd, path)
    finally:
        os.close(fd)


def check_folder_ledger(path: str) -> None:
    """`check_ledger_at` for the folder at `path` (ValueError too where it cannot be opened)."""
    try:
        folder = Beneath(path)
    except OSError as e:
        raise ValueError(f"storage.path={path}: {e.strerror}") from e
    try:
        check_ledger_at(folder, path)
    finally:
        folder.close()


def _make(beneath: Beneath, capacity: int) -> None:
    """A ledger in place, unless a `.usage` is there already (whatever it is)."""
    making = f"{MAKING}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    fd = beneath.open([making], flags, 0o600)
    try:
        try:
            os.write(fd, pack(Ledger(0, 0, capacity)))
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(
                making, LEDGER, src_dir_fd=beneath.fd, dst_dir_fd=beneath.fd, follow_symlinks=False
            )
    finally:
        with contextlib.suppress(OSError):
            os.unlink(making, dir_fd=beneath.fd)


def ledger_capacity(beneath: Beneath, path: str) -> int | None:
    """The capacity a folder's ledger bounds it by; None where the folder has no ledger (or
    a `.usage` that is not one); ValueError where an old ledger does not say it."""
    try:
        fd = beneath.open([LEDGER], os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = read_ledger(fd) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)
    if found is None:
        return None
    if found.capacity == 0:
        raise ValueError(
            f"storage.path={path}: a bounded store's ledger is in the folder; pass "
            "storage.capacity_bytes so this store keeps the bound too"
        )
    return found.capacity
