"""What an operator asks of a file store's folder (`hicache-pipeline store`): what it holds,
whether every object is intact, and room made in it, least recently used objects first.

The folder is refused before anything is read or removed unless it is a real folder (not a
link) that holds only namespace folders: a mistyped path never loses a byte of anything else.
Every object is opened below the folder's descriptor with no link followed.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from pipeline.engine.stores.beneath import FOLDER_FLAGS, Beneath
from pipeline.engine.stores.capacity import LEDGER, LEDGER_FORMAT, LEDGER_MAGIC, Bound, walk
from pipeline.engine.stores.counters import Counters
from pipeline.spec.l3 import (
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    Checks,
    PageObject,
    namespace,
    unit_digests,
)
from pipeline.spec.model import ModelGeometry

NAMESPACE = re.compile(r"v\d+-\w+-p\d+-[0-9a-f]{16}")
"""A namespace folder's name (`pipeline.spec.l3.namespace`), of any format version."""


def open_folder(path: str) -> Beneath:
    """The store's folder, kept open; ValueError naming the path where it is missing, a
    link, not a folder, or holds anything but namespace folders (not a store's)."""
    where = Path(path)
    if where.is_symlink():
        raise ValueError(f"{path}: a symbolic link; name the store's folder itself")
    if not where.exists():
        raise ValueError(f"{path}: no such folder")
    if not where.is_dir():
        raise ValueError(f"{path}: not a folder")
    try:
        os.close(os.open(path, FOLDER_FLAGS))  # a link put there since: refused here
        folder = Beneath(path)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from e
    strangers = sorted(n for n in os.listdir(folder.fd) if not _ours(folder, n))
    if strangers:
        folder.close()
        raise ValueError(
            f"{path}: not a store's folder (it holds {', '.join(strangers[:3])}; a store "
            "holds only namespace folders such as v2-bfloat16-p64-<16 hex digits>)"
        )
    return folder


def _ours(folder: Beneath, name: str) -> bool:
    """A namespace folder, or the store's ledger (or another hidden name)."""
    if name.startswith("."):
        return True
    info = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    return NAMESPACE.fullmatch(name) is not None and stat.S_ISDIR(info.st_mode)


def store_stats(path: str) -> dict:
    """Objects and bytes, in all and per namespace, and what the ledger of a bounded store
    says (None where no bounded store wrote the folder)."""
    folder = open_folder(path)
    try:
        spaces: dict[str, dict[str, int]] = {}
        for stored in walk(folder):
            space = spaces.setdefault(stored.name.split("/")[0], {"objects": 0, "bytes": 0})
            space["objects"] += 1
            space["bytes"] += stored.size
        return {
            "path": path,
            "objects": sum(s["objects"] for s in spaces.values()),
            "bytes": sum(s["bytes"] for s in spaces.values()),
            "namespaces": dict(sorted(spaces.items())),
            "ledger": _ledger(folder),
        }
    finally:
        folder.close()


def _ledger(folder: Beneath) -> dict[str, int] | None:
    try:
        fd = folder.open([LEDGER], os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.pread(fd, LEDGER_FORMAT.size, 0) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if len(raw) != LEDGER_FORMAT.size or raw[:8] != LEDGER_MAGIC:
        return None
    _, held_bytes, held_objects = LEDGER_FORMAT.unpack(raw)
    return {"objects": held_objects, "bytes": held_bytes}


def evict_store(path: str, to_bytes: int) -> dict:
    """Remove objects, least recently used first, until the folder holds at most `to_bytes`
    (under the lock every process writing the folder takes)."""
    folder = open_folder(path)
    try:
        bound = Bound(folder, Counters())
        try:
            done = bound.evict(to_bytes)
        finally:
            bound.close()
    finally:
        folder.close()
    return {
        "path": path,
        "to_bytes": to_bytes,
        "evicted_objects": done.objects,
        "evicted_bytes": done.bytes,
        "objects": done.held_objects,
        "bytes": done.held_bytes,
    }


@dataclass(frozen=True)
class Known:
    """What verify knows of the objects of one namespace: their units (from the composed
    model), so each unit's digest is checked, not only the header's."""

    space: str
    page: PageObject
    """Its objects' units, in the payload's order (whichever share an object holds)."""

    @classmethod
    def of(cls, model: ModelGeometry) -> Known:
        return cls(namespace(model), PageObject("", model.units))


def verify_store(path: str, known: Known | None, checks: Checks, *, remove: bool) -> dict:
    """Read every object whole and check it: its header (its own digest, that it names the
    object where it lies, its length) and, for `known`'s namespace, every unit's digest.
    Corrupt objects are listed with why (and unlinked where `remove`); objects of another
    format version, or keyed ones without the key, are skipped, never removed."""
    folder = open_folder(path)
    corrupt, skipped, units_checked, count = [], [], 0, 0
    try:
        for stored in walk(folder):
            count += 1
            verdict = _verdict(folder, stored.name, known, checks)
            if verdict.startswith("skipped: "):
                skipped.append({"name": stored.name, "reason": verdict[9:]})
            elif verdict:
                corrupt.append({"name": stored.name, "reason": verdict})
                if remove:
                    _unlink(folder, stored.name)
            else:
                units_checked += known is not None and stored.name.startswith(known.space + "/")
    finally:
        folder.close()
    if remove and corrupt and _ledger_exists(path):
        evict_store(path, 1 << 62)  # nothing evicted: the ledger counted again
    return {
        "path": path,
        "objects": count,
        "intact": count - len(corrupt) - len(skipped),
        "units_checked": units_checked,
        "corrupt": corrupt,
        "removed": len(corrupt) if remove else 0,
        "skipped": skipped,
    }


def _verdict(folder: Beneath, name: str, known: Known | None, checks: Checks) -> str:
    """'' for an intact object, else what is wrong ('skipped: ...' where it cannot tell)."""
    try:
        blob = _read_whole(folder, name)
    except OSError as e:
        return f"unreadable: {e.strerror}"
    if len(blob) < HEADER.size or blob[:5] != MAGIC:
        return "not an object of this store (no header)"
    _, version, ns_len, name_len, kind, num_units, payload, _ = HEADER.unpack_from(blob)
    if version != FORMAT_VERSION:
        return f"skipped: format version {version} (this build reads {FORMAT_VERSION})"
    use = Checks(None) if kind == 0 else checks if kind == checks.kind else None
    if use is None:
        return "skipped: keyed (give storage.auth_key_file=KEY to check it)"
    head_len = HEADER.size + ns_len + name_len + use.width * num_units
    space = name.split("/")[0]
    names = blob[HEADER.size : HEADER.size + ns_len + name_len]
    if ns_len != len(space.encode()) or names != (space + name).encode():
        return "its header names another object (or is damaged)"
    if len(blob) != head_len + payload:
        return f"{len(blob)} bytes where its header says {head_len + payload}"
    if known is None or space != known.space:
        return _header_verdict(blob[:head_len], use)
    table = unit_digests(blob[:head_len], known.page, space, name, use)
    if table is None:
        return "its header does not check (damaged, or another model's geometry)"
    digest, at = use.unit(), head_len
    for unit, want in zip(known.page.units, table, strict=True):
        if digest(memoryview(blob)[at : at + unit.page_bytes]) != want:
            return f"unit {unit.ordinal} (layer {unit.layer}, {unit.pool}) does not check"
        at += unit.page_bytes
    return ""


def _header_verdict(head: bytes, use: Checks) -> str:
    """The header's own digest, for a namespace whose units verify does not know (the
    units' sizes are the model's): as `pipeline.spec.l3.header` computes it."""
    *fields, check = HEADER.unpack_from(head)
    blank = HEADER.pack(*fields, bytes(16)) + head[HEADER.size :]
    return "" if use.unit()(blank).to_bytes(16, "little") == check else "its header is damaged"


def _read_whole(folder: Beneath, name: str) -> bytes:
    fd = folder.open(name.split("/"), os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _unlink(folder: Beneath, name: str) -> None:
    *folders, leaf = name.split("/")
    fd = folder.open(folders, FOLDER_FLAGS)
    try:
        os.unlink(leaf, dir_fd=fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _ledger_exists(path: str) -> bool:
    return os.path.lexists(os.path.join(path, LEDGER))
