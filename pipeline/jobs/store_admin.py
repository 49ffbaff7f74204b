"""What an operator asks of a file store's folder (`hicache-pipeline store`): what it holds,
and room made in it, least recently used objects first (`store_verify`: whether every object
is intact).

The folder is refused before anything is read or removed unless it is a real folder (not a
link) that holds namespace folders and nothing else but the store's ledger: a mistyped path
never loses a byte of anything else. Only the store's own objects (their place and their
header say so, `pipeline.engine.l3.stores.owned`) are counted or removed; every object is opened
below the folder's descriptor with no link followed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from pipeline.core.l3_owned import NAMESPACE
from pipeline.engine.l3.stores.beneath import FOLDER_FLAGS, Beneath
from pipeline.engine.l3.stores.capacity import Bound, evict_pass
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.ledger import LEDGER, MAKING, check_ledger_at, read_ledger
from pipeline.engine.l3.stores.owned import Passed, walk

MADE_LEDGER = re.compile(re.escape(MAKING) + r"[0-9a-f]{16}")
"""A ledger being made (`ledger.MAKING`): the store's own, beside its ledger."""


def open_folder(path: str) -> Beneath:
    """The store's folder, kept open; ValueError naming the path where it is missing, a
    link, not a folder, or not a store's (anything but namespace folders and the ledger, or
    no namespace folder and no ledger)."""
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
    try:
        _check_top(folder, path)
    except BaseException:
        folder.close()
        raise
    return folder


def _check_top(folder: Beneath, path: str) -> None:
    try:
        names = sorted(os.listdir(folder.fd))
    except OSError as e:
        raise ValueError(f"{path}: cannot be listed ({e.strerror})") from e
    strangers = [n for n in names if not _ours(folder, n)]
    if strangers:
        raise ValueError(
            f"{path}: not a store's folder (it holds {', '.join(strangers[:3])}; a store "
            "holds only namespace folders such as v3-bf16-p64-<16 hex digits> and its ledger "
            f"{LEDGER})"
        )
    if not any(NAMESPACE.fullmatch(n) for n in names) and LEDGER not in names:
        raise ValueError(
            f"{path}: not a store's folder (it holds no namespace folder such as "
            "v3-bf16-p64-<16 hex digits>, and no ledger)"
        )
    if LEDGER in names:
        check_ledger_at(folder, path)


def _ours(folder: Beneath, name: str) -> bool:
    """A namespace folder, the ledger, or a ledger being made."""
    if name == LEDGER or MADE_LEDGER.fullmatch(name):
        return True
    try:
        info = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except OSError:
        return False
    return NAMESPACE.fullmatch(name) is not None and stat.S_ISDIR(info.st_mode)


def store_stats(path: str) -> dict:
    """Objects and bytes, in all and per namespace, what the ledger of a bounded store says
    (None where no bounded store wrote the folder), and what the count left alone."""
    folder = open_folder(path)
    passed = Passed()
    try:
        spaces: dict[str, dict[str, int]] = {}
        for stored in walk(folder, passed):
            space = spaces.setdefault(stored.name.split("/")[0], {"objects": 0, "bytes": 0})
            space["objects"] += 1
            space["bytes"] += stored.size
        return {
            "path": path,
            "objects": sum(s["objects"] for s in spaces.values()),
            "bytes": sum(s["bytes"] for s in spaces.values()),
            "namespaces": dict(sorted(spaces.items())),
            "ledger": _ledger(folder),
            "left_alone": passed.notes,
        }
    finally:
        folder.close()


def _ledger(folder: Beneath) -> dict[str, int] | None:
    try:
        fd = folder.open([LEDGER], os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = read_ledger(fd)
    finally:
        os.close(fd)
    if found is None:
        return None
    return {"objects": found.objects, "bytes": found.bytes, "capacity": found.capacity}


def evict_store(path: str, to_bytes: int, timeout_s: float) -> dict:
    """Remove objects, least recently used first, until the folder holds at most `to_bytes`:
    under the lock every writer of a bounded folder takes (waiting at most `timeout_s`), or,
    where no bounded store wrote the folder, without one (and without making a ledger)."""
    folder = open_folder(path)
    try:
        ledger = _ledger(folder)
        if ledger is None:
            done = evict_pass(folder, to_bytes, Counters())
        else:
            bound = Bound(
                folder, Counters(), path=path, capacity=ledger["capacity"], timeout_s=timeout_s
            )
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
        "left_alone": list(done.left_alone),
    }
