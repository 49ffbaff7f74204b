"""A file store's bound: what its folder holds, in a small ledger beside the objects that every
process sharing the folder updates under one lock, and the eviction that keeps the objects
under `storage.capacity_bytes`, least recently used first.

An object's last use is its access time, which the store sets itself when it writes or reads
one (the kernel's own atime is lazy or off on most mounts). The lock serializes the ledger's
updates and eviction passes across processes, never a read: a reader that opened an object
reads all of it even when an eviction unlinks it meanwhile (POSIX keeps an open file), and
one that comes later finds nothing, a miss.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pipeline.engine.stores.beneath import FOLDER_FLAGS, Beneath
from pipeline.engine.stores.counters import Counters

COMPONENT = re.compile(r"[\w-][\w.-]*")
"""One folder or file name of an object name: no separators, nothing hidden, never '..'."""
LEDGER = ".usage"
"""The ledger, and the lock, in the store's root: a hidden name, so no object's."""
LEDGER_FORMAT = struct.Struct("<8sqq")
"""Its magic, then the bytes and the number of objects the folder holds."""
LEDGER_MAGIC = b"HCPLUSE1"
MAX_DEPTH = 8
"""Folders a walk goes down at most (objects lie 3 deep: namespace, key prefix, key)."""
TEMPORARY = ".tmp-"
"""How a write in flight is named (`FileStore.put`), beside the object it becomes."""
STALE_TEMPORARY_NS = 3600 * 10**9
"""A temporary file this old is a crashed writer's (a write takes milliseconds): an
eviction pass removes it."""


@dataclass(frozen=True)
class Stored:
    """One object in the folder, as a walk found it."""

    name: str
    size: int
    used_ns: int
    """When it was last written or read (its access time)."""
    inode: int


def walk(beneath: Beneath, temporaries: list[Stored] | None = None) -> Iterator[Stored]:
    """Every object below the root: the regular files whose every name is a store name (no
    write in flight, no ledger), found without following a link; a file that goes while
    the walk runs (evicted, renamed) is left out. `temporaries` collects the writes in
    flight (their modification time as their use), or that a crashed writer left."""
    yield from _walk(beneath.fd, [], MAX_DEPTH, temporaries)


def _walk(
    fd: int, parts: list[str], depth: int, temporaries: list[Stored] | None
) -> Iterator[Stored]:
    with os.scandir(fd) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        temporary = name.startswith(TEMPORARY)
        if not COMPONENT.fullmatch(name) and not (temporary and temporaries is not None):
            continue
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        used = info.st_mtime_ns if temporary else info.st_atime_ns
        found = Stored("/".join([*parts, name]), info.st_size, used, info.st_ino)
        if stat.S_ISREG(info.st_mode):
            if temporary and temporaries is not None:
                temporaries.append(found)
            elif not temporary:
                yield found
        elif stat.S_ISDIR(info.st_mode) and depth > 1 and not temporary:
            with contextlib.suppress(FileNotFoundError):  # evicted or removed meanwhile
                inner = os.open(name, FOLDER_FLAGS, dir_fd=fd)
                try:
                    yield from _walk(inner, [*parts, name], depth - 1, temporaries)
                finally:
                    os.close(inner)


@dataclass(frozen=True)
class Evicted:
    """What an eviction pass removed, and what the folder held after it."""

    objects: int
    bytes: int
    held_objects: int
    held_bytes: int


class Bound:
    """The ledger of one store's folder, and eviction under its lock (between processes:
    flock on the ledger; between this process's threads: a lock of its own, since flock
    holds per open file, not per thread). A new one counts the folder again: the bound holds
    across restarts, whatever wrote the folder before."""

    def __init__(self, beneath: Beneath, counters: Counters) -> None:
        self.beneath, self.counters = beneath, counters
        self.fd = beneath.open([LEDGER], os.O_RDWR | os.O_CREAT, 0o600)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise ValueError(f"storage.path: {LEDGER} in the store's folder is not a file")
        self._threads = threading.Lock()
        with self.locked():
            self._write(*self._count())

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with self._threads:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def held(self) -> tuple[int, int]:
        """(bytes, objects) the ledger says the folder holds."""
        raw = os.pread(self.fd, LEDGER_FORMAT.size, 0)
        if len(raw) != LEDGER_FORMAT.size or raw[:8] != LEDGER_MAGIC:
            return 0, 0  # a ledger made and not yet written: counted under the lock next
        _, held_bytes, held_objects = LEDGER_FORMAT.unpack(raw)
        return max(held_bytes, 0), max(held_objects, 0)

    def _write(self, held_bytes: int, held_objects: int) -> None:
        os.pwrite(self.fd, LEDGER_FORMAT.pack(LEDGER_MAGIC, held_bytes, held_objects), 0)

    def _count(self) -> tuple[int, int]:
        found = list(walk(self.beneath))
        return sum(s.size for s in found), len(found)

    @contextlib.contextmanager
    def admit(self, size: int, capacity: int, target: int) -> Iterator[None]:
        """For the block that renames an object of `size` bytes in: the ledger counts it
        (first, so a crash between the two counts too much, never too little), and where the
        folder would then pass `capacity`, objects go, least recently used first, until it
        holds at most `target` bytes with this one."""
        with self.locked():
            held_bytes, held_objects = self.held()
            if held_bytes + size > capacity:
                done = self._evict(target - size)
                held_bytes, held_objects = done.held_bytes, done.held_objects
            self._write(held_bytes + size, held_objects + 1)
            yield

    def removed(self, size: int) -> None:
        """An object of `size` bytes is gone (a caller's remove)."""
        with self.locked():
            held_bytes, held_objects = self.held()
            self._write(max(held_bytes - size, 0), max(held_objects - 1, 0))

    def evict(self, to_bytes: int) -> Evicted:
        """Remove objects, least recently used first, until the folder holds at most
        `to_bytes` (what `store evict` runs)."""
        with self.locked():
            done = self._evict(to_bytes)
            self._write(done.held_bytes, done.held_objects)
            return done

    def _evict(self, to_bytes: int) -> Evicted:
        """Under the lock: the folder counted again (other processes' writes, crashes, a
        replaced object: the ledger is exact after each pass), then the oldest removed."""
        temporaries: list[Stored] = []
        found = sorted(walk(self.beneath, temporaries), key=lambda s: s.used_ns)
        held_bytes, held_objects = sum(s.size for s in found), len(found)
        stale = time.time_ns() - STALE_TEMPORARY_NS
        for left in (t for t in temporaries if t.used_ns < stale):
            self._unlink_unused(left)
        objects = freed = 0
        for stored in found:
            if held_bytes <= to_bytes:
                break
            outcome = self._unlink_unused(stored)
            if outcome == "kept":
                continue
            if outcome == "evicted":
                objects, freed = objects + 1, freed + stored.size
            held_bytes, held_objects = held_bytes - stored.size, held_objects - 1
        self.counters.add(evictions=objects, evicted_bytes=freed)
        return Evicted(objects, freed, held_objects, held_bytes)

    def _unlink_unused(self, stored: Stored) -> str:
        """'evicted'; 'kept' where the object changed since the walk (rewritten, or read: no
        longer the least recently used); 'gone' where another process removed it."""
        *folders, leaf = stored.name.split("/")
        try:
            folder = self.beneath.open(folders, FOLDER_FLAGS)
        except FileNotFoundError:
            return "gone"
        except OSError:  # a link planted since the walk: not ours to follow
            return "kept"
        try:
            now = os.stat(leaf, dir_fd=folder, follow_symlinks=False)
            used = now.st_mtime_ns if leaf.startswith(TEMPORARY) else now.st_atime_ns
            if (now.st_ino, used) != (stored.inode, stored.used_ns):
                return "kept"
            os.unlink(leaf, dir_fd=folder)
            return "evicted"
        except FileNotFoundError:
            return "gone"
        except OSError:
            return "kept"
        finally:
            os.close(folder)

    def close(self) -> None:
        os.close(self.fd)
