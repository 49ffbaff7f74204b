"""`hicache-pipeline store verify`: every byte of every object checked, from its header alone
(format 3 says each unit's length and digest), read in bounded pieces.

An object is "intact" only where every byte was checked; one that cannot be (a keyed object
without its key, another format version, an unreadable file) is "not checked", with why, and
never removed. Only an object that proves to be the store's (`owned`) and is proven damaged
is "corrupt", and only that is removed (`--remove`). With a key, an object it does not
authenticate (unkeyed, or another key's) is corrupt too, a miss for every keyed reader, once
another object checks with the key (proof that it is the store's, not a mistyped one).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c

from pipeline.core.l3 import (
    FORMAT_VERSION,
    HEADER,
    KEY_ID,
    MAX_OBJECT_BYTES,
    MAX_UNITS,
    UNIT_BYTES,
    Checks,
    header_check,
    unit_rows,
)
from pipeline.core.l3_owned import name_bytes, names_itself
from pipeline.engine.l3.stores.beneath import Beneath
from pipeline.engine.l3.stores.ledger import LEDGER
from pipeline.engine.l3.stores.owned import PEEK_FLAGS, Passed, Stored, unlink_unchanged, walk
from pipeline.jobs.store_admin import evict_store, open_folder

PIECE_BYTES = 1 << 20
"""The most of an object read at once."""


@dataclass(frozen=True)
class Verdict:
    """What verify found of one object: '' for intact, else why (`checked`: proven damaged;
    not `checked`: it could not tell; `unkeyed`: the key given does not authenticate it)."""

    why: str = ""
    checked: bool = True
    unkeyed: bool = False
    """Made without the key given, or with another: a keyed store reads it as a miss, so it
    is corrupt there, once the key proves to be the store's (an object checks with it)."""


@dataclass
class Found:
    """What a verify found so far: each object listed with why, and the files it read."""

    corrupt: list[tuple[dict, Stored | None]] = field(default_factory=list)
    unchecked: list[dict] = field(default_factory=list)
    unkeyed: list[tuple[dict, Stored | None]] = field(default_factory=list)
    count: int = 0


def verify_store(path: str, checks: Checks, *, remove: bool, timeout_s: float) -> dict:
    """Check every object of the folder; corrupt ones listed with why (and unlinked where
    `remove`, the ledger counted again after under the writers' lock)."""
    folder = open_folder(path)
    passed, found, removed = Passed(), Found(), 0
    try:
        for stored in walk(folder, passed):
            found.count += 1
            verdict, opened = _verdict(folder, stored, checks)
            listed = {"name": stored.name, "reason": verdict.why}
            if verdict.unkeyed:
                found.unkeyed.append((listed, opened))
            elif verdict.why and verdict.checked:
                found.corrupt.append((listed, opened))
            elif verdict.why:
                found.unchecked.append(listed)
        _judge_unkeyed(found)
        if remove:  # each checked again to be the very file it read
            gone = [unlink_unchanged(folder, o) for _, o in found.corrupt if o is not None]
            removed = gone.count("removed")
    finally:
        folder.close()
    if removed and os.path.lexists(os.path.join(path, LEDGER)):
        evict_store(path, 1 << 62, timeout_s)  # nothing evicted: the ledger counted again
    corrupt = [listed for listed, _ in found.corrupt]
    return {
        "path": path,
        "objects": found.count,
        "intact": found.count - len(corrupt) - len(found.unchecked),
        "corrupt": corrupt,
        "removed": removed,
        "not_checked": found.unchecked,
        "left_alone": passed.notes,
    }


def _judge_unkeyed(found: Found) -> None:
    """Objects the key does not authenticate are corrupt where another object checked intact
    with it (the key is the store's: its readers miss them, its write-backs replace them);
    where none did, the key may be the wrong one, and they are not checked (never removed)."""
    proven = found.count - len(found.corrupt) - len(found.unchecked) - len(found.unkeyed) > 0
    for listed, opened in found.unkeyed:
        if proven:
            found.corrupt.append((listed, opened))
        else:
            reason = f"{listed['reason']}, and no object here checks with it: not checked"
            found.unchecked.append({**listed, "reason": reason})
    found.corrupt.sort(key=lambda c: c[0]["name"])  # in the walk's order, by name
    found.unchecked.sort(key=lambda c: c["name"])


def _verdict(folder: Beneath, stored: Stored, checks: Checks) -> tuple[Verdict, Stored | None]:
    """The verdict on `stored`, and the file it read as found (for a removal that re-checks
    it is still that file)."""
    try:
        fd = _open(folder, stored.name)
    except OSError as e:
        return Verdict(f"unreadable ({e.strerror})", checked=False), None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OBJECT_BYTES:
            return Verdict("not an object of this store", checked=False), None
        verdict = _check(fd, stored.name, info.st_size, checks)
        return verdict, Stored(stored.name, info.st_size, info.st_atime_ns, info.st_ino)
    except OSError as e:
        return Verdict(f"unreadable ({e.strerror})", checked=False), None
    finally:
        os.close(fd)


def _open(folder: Beneath, name: str) -> int:
    """`name` opened for reads below the folder, its access time kept where we may."""
    try:
        return folder.open(name.split("/"), PEEK_FLAGS | os.O_NOATIME)
    except PermissionError as e:
        if e.errno != errno.EPERM:
            raise
        return folder.open(name.split("/"), PEEK_FLAGS)


def _check(fd: int, name: str, size: int, checks: Checks) -> Verdict:
    head = os.pread(fd, name_bytes(name) + KEY_ID, 0)
    if not names_itself(head, name):
        return Verdict("not an object of this store", checked=False)
    _, version, _, _, kind, units, payload, check = HEADER.unpack_from(head)
    if version != FORMAT_VERSION:
        why = f"format version {version} (this build checks {FORMAT_VERSION}): not checked"
        return Verdict(why, checked=False)
    if kind == 0 and checks.key is not None:
        return Verdict(
            "unkeyed: the key given (storage.auth_key_file) does not authenticate it", unkeyed=True
        )
    use = Checks(None) if kind == 0 else checks if kind == 1 else None
    if use is None or use.kind != kind:
        return Verdict("keyed: not checked (give storage.auth_key_file=KEY)", checked=False)
    if head[name_bytes(name) :] != use.key_id:
        return Verdict("keyed with another key", unkeyed=True)
    if units > MAX_UNITS:
        return Verdict(f"{units} units, more than any object has: not checked", checked=False)
    head_bytes = name_bytes(name) + KEY_ID + units * (use.width + UNIT_BYTES.size)
    if size < head_bytes:
        return Verdict(f"{size} bytes, shorter than its own header")
    head = _read(fd, 0, head_bytes)
    rest = head[HEADER.size :]
    if header_check(HEADER.unpack_from(head)[:-1], rest, use) != check:
        return Verdict("its header does not check (damaged)")
    rows = unit_rows(rest[name_bytes(name) - HEADER.size + KEY_ID :], use.width)
    if sum(n for _, n in rows) != payload or size != head_bytes + payload:
        return Verdict(f"{size} bytes where its header says {head_bytes + payload}")
    at = head_bytes
    for i, (want, length) in enumerate(rows):
        if _digest(fd, at, length, use) != want:
            return Verdict(f"unit {i} ({length} B at byte {at}) does not check")
        at += length
    return Verdict()


def _read(fd: int, at: int, length: int) -> bytes:
    got = b"".join(_pieces(fd, at, length))
    if len(got) != length:
        raise OSError(errno.EIO, "it was cut short while read")
    return got


def _digest(fd: int, at: int, length: int, use: Checks) -> int:
    """The digest of `length` bytes from `at`, read a piece at a time."""
    if use.key is None:
        crc = 0
        for piece in _pieces(fd, at, length):
            crc = crc32c.crc32c(piece, crc)
        return crc
    state = hashlib.blake2b(key=use.key, digest_size=16)
    for piece in _pieces(fd, at, length):
        state.update(piece)
    return int.from_bytes(state.digest(), "little")


def _pieces(fd: int, at: int, length: int) -> Iterator[bytes]:
    end = at + length
    while at < end:
        piece = os.pread(fd, min(PIECE_BYTES, end - at), at)
        if not piece:
            raise OSError(errno.EIO, "it was cut short while read")
        yield piece
        at += len(piece)
