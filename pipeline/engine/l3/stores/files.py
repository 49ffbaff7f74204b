"""The file store: one file per object under a folder on this machine's disk."""

from __future__ import annotations

import collections
import contextlib
import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from pipeline.core.l3_owned import is_object_name
from pipeline.engine.l3.stores._fileio import present
from pipeline.engine.l3.stores.beneath import FOLDER_FLAGS, Beneath, store_name, store_names
from pipeline.engine.l3.stores.capacity import Quota, open_bound
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.direct import DirectReads, in_memory
from pipeline.engine.l3.stores.file_parts import FileParts, used
from pipeline.engine.l3.stores.file_writes import put_object, put_objects
from pipeline.engine.l3.stores.keys import read_key_file
from pipeline.engine.l3.stores.ledger import ledger_capacity
from pipeline.engine.l3.stores.owned import own_size
from pipeline.engine.l3.stores.parts import (
    Check,
    Part,
    Range,
    read_ranges,
)

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""Never through a link; a FIFO or device planted there opens without blocking (and is then
refused as not a regular file)."""
TIMEOUT_S = 120.0
"""The longest a wait on the folder's lock lasts where the caller does not say
(`runtime.timeout_s`'s default)."""
RECENT_LISTS = 8
"""The name lists of the latest `exists` calls kept: a write-back's, and lookups beside it."""

__all__ = ["FileStore", "read_key_file"]


class FileStore:
    """One file per object under a folder; a write lands whole or not at all (a temporary
    file in the same folder, then a rename). Every open below the root is relative to its
    folder's descriptor and follows no link; only regular files are read. With `direct`,
    reads bypass the page cache (for objects that are not cached: a cold store). With
    `capacity_bytes` (or, without, where the folder's ledger bounds it), a write that would
    pass it first evicts the least recently used objects until they take `evict_to` of it
    (`capacity.Bound`, shared with every process that writes the folder), never the objects
    of the write-back it belongs to: a write-back first asks which of its objects `exists`,
    and the names of a recent such call that holds the object being written are kept. A
    `quota` bounds one tenant's objects within the folder (`capacity.Bound.admit`)."""

    def __init__(
        self,
        root: str,
        direct: DirectReads | None = None,
        *,
        capacity_bytes: int | None = None,
        evict_to: float = 0.9,
        timeout_s: float = TIMEOUT_S,
        quota: Quota | None = None,
        threads: int = 1,
    ) -> None:
        self.root = Path(root)
        self.direct = direct
        self.threads = threads  # a lookup's (`exists`)
        self.beneath = Beneath(root)
        """The root, kept open: every path below it is opened without following a link."""
        self.counters = Counters()
        self._lists: collections.deque[frozenset[str]] = collections.deque(maxlen=RECENT_LISTS)
        self._lists_lock = threading.Lock()
        try:
            capacity = capacity_bytes or ledger_capacity(self.beneath, root)
            self.capacity_bytes = capacity
            self.target_bytes = int(evict_to * capacity) if capacity else 0
            """What an eviction leaves the folder holding, at most."""
            self.bound = open_bound(self.beneath, self.counters, root, capacity, timeout_s, quota)
        except BaseException:
            self.beneath.close()
            raise

    def stats(self) -> dict[str, int | None]:
        """This process's counts (`counters.COUNTED`), and what the folder holds: `objects`
        and `bytes` from the ledger of a bounded store, None for an unbounded one (which
        keeps no ledger; `hicache-pipeline store stats` counts its folder)."""
        held = self.bound.held() if self.bound is not None else (None, None)
        return {**self.counters.snapshot(), "bytes": held[0], "objects": held[1]}

    def _split(self, name: str) -> tuple[list[str], str]:
        if not store_name(name):
            raise ValueError(f"object name {name!r} is not a store name")
        parts = name.split("/")
        return parts[:-1], parts[-1]

    def _folder(self, folders: list[str], *, create: bool) -> int:
        """A descriptor of the object's folder, below the root with no link followed (made
        where `create`); OSError where a part is missing or not a real folder."""
        try:
            return self.beneath.open(folders, FOLDER_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
        for depth in range(len(folders)):  # the first write into a folder: make what is missing
            parent = self.beneath.open(folders[:depth], FOLDER_FLAGS)  # [] is the root itself
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folders[depth], dir_fd=parent)
            finally:
                os.close(parent)
        return self.beneath.open(folders, FOLDER_FLAGS)

    def _open(self, name: str, flags: int = READ_FLAGS) -> int:
        """A descriptor of the regular file `name`; OSError otherwise."""
        return self._opened(name, flags)[0]

    def _opened(self, name: str, flags: int) -> tuple[int, os.stat_result]:
        """`_open`, and the file's status."""
        folders, leaf = self._split(name)
        fd = self.beneath.open([*folders, leaf], flags)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OSError(f"{name} is not a regular file")
        return fd, info

    def put(self, name: str, parts: Sequence[Part]) -> None:
        put_object(self, name, parts)

    def kept_with(self, name: str) -> frozenset[str]:
        """What a write of `name` must not evict: the names of the latest `exists` call that
        holds it (its write-back's objects), and itself."""
        with self._lists_lock:
            found = next((names for names in reversed(self._lists) if name in names), None)
        return found or frozenset([name])

    def read(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None = None
    ) -> bool:
        found = self.read_once(name, size, ranges, check)
        self.counters.add(**{"hits" if found else "misses": 1})
        return found

    def parts_reader(self) -> FileParts:
        return FileParts(self)

    def units_writer(self) -> FileStore | None:
        """Native writes (a bound makes room for a batch at once: `file_writes.put_objects`)."""
        return self

    sums_units = True  # `_fileio.write_objects` sums each unit before it writes it

    def put_many(
        self,
        objects: Sequence[tuple[str, Sequence[Part]]],
        tables: Sequence[int] | None = None,
        units: Sequence[int] | None = None,
    ) -> None:
        put_objects(self, objects, tables, units)

    def units_reader(self) -> FileParts | None:
        """Native reads through the page cache (not O_DIRECT's aligned staging)."""
        return None if self.direct is not None else FileParts(self)

    def paths_below(self, names: Sequence[str]) -> tuple[int, list[str]] | None:
        if not self.beneath.one_call:
            return None
        return self.beneath.fd, store_names(names)  # "": opens none

    def open_read(self, name: str) -> tuple[int, os.stat_result]:
        return self._opened(name, READ_FLAGS | (os.O_DIRECT if self.direct else 0))

    def read_once(self, name: str, size: int, ranges: Sequence[Range], check: Check | None) -> bool:
        """`read`, not counted."""
        try:
            fd, info = self.open_read(name)
        except (OSError, ValueError):
            return False
        try:
            if ranges and ranges[0][0] == 0:  # a read of its later parts (a streamed load's
                used(fd, info.st_mtime_ns)  # later layers) follows one of its start
            return self.read_open(fd, info, size, ranges, check)
        finally:
            os.close(fd)

    def read_open(
        self, fd: int, info: os.stat_result, size: int, ranges: Sequence[Range], check: Check | None
    ) -> bool:
        """`read` from the regular file open at `fd` (its status `info`)."""
        try:
            if info.st_size != size:
                return False
            if self.direct is not None:
                return self.direct.read(fd, size, ranges, check)
            return read_ranges(fd, ranges, check)
        except OSError:
            return False

    def get(self, name: str) -> bytes | None:
        try:
            fd, info = self._opened(name, READ_FLAGS)
        except (OSError, ValueError):
            return None
        os.close(fd)
        blob = bytearray(info.st_size)
        return bytes(blob) if self.read(name, len(blob), [(0, [memoryview(blob)])]) else None

    def exists(self, names: list[str]) -> list[bool]:
        """Opened as reads open them: in one native call where it can (`_fileio.present`)."""
        with self._lists_lock:
            self._lists.append(frozenset(names))
        if (below := self.paths_below(names)) is not None:
            return present(below, self.threads)
        return [self._there(name) for name in names]

    def _there(self, name: str) -> bool:
        try:
            os.close(self._open(name))
        except (OSError, ValueError):
            return False
        return True

    def remove(self, names: list[str]) -> None:
        """Drop these objects: only where the name is an object's and its header names it
        (anything else under such a name is not the store's, and stays)."""
        for name in names:
            folders, leaf = self._split(name)
            if not is_object_name(name):
                continue
            try:
                folder = self._folder(folders, create=False)
            except OSError:  # absent, or not a real folder: nothing of ours to remove
                continue
            try:
                size = own_size(folder, leaf, name)
                if size is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(leaf, dir_fd=folder)
                        if self.bound is not None:
                            self.bound.removed(size)
            finally:
                os.close(folder)

    def forget_cached(self, names: list[str]) -> bool:
        """Ask the OS to drop these objects from its page cache (a cold read next); False
        where it cannot say it did (the folder is in memory: tmpfs keeps every page)."""
        dropped = not in_memory(self.root)
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                fd = self._open(name)
                try:
                    os.fsync(fd)  # dirty pages stay cached until written out
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        return dropped

    def cut(self, space: str, payload_bytes: int, cuts: Sequence[int]) -> None:
        """A file's ranges read as fast as the whole: its objects stay one file each."""

    def register(self, buffers: Sequence[memoryview]) -> None:
        """Reads land where they are asked to: nothing to register."""

    unregister = register

    def close(self) -> None:
        if self.bound is not None:
            self.bound.close()
        self.beneath.close()
