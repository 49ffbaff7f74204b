"""The file store's writes: each object a temporary file in its folder, written whole, then
renamed over its name (a reader sees all of it or none), every step relative to the folder's
descriptor. One at a time (`put_object`: where the store is bounded, room is made for each
inside its rename), or many in one native call on the store's threads (`put_objects`: where
bounded, room made for all at once, then each renamed in)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.core.l3 import CHECK_AT
from pipeline.engine.l3.stores._fileio import write_objects
from pipeline.engine.l3.stores.capacity import Bound, CapacityFull
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.owned import TEMPORARY
from pipeline.engine.l3.stores.parts import IOV_MAX, Part, advance, bytes_views, part_bytes

WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FileStore(Protocol):
    """What the writes need of the file store (`files.FileStore`)."""

    root: Path
    bound: Bound | None
    capacity_bytes: int | None
    target_bytes: int
    counters: Counters
    threads: int

    def _split(self, name: str) -> tuple[list[str], str]: ...

    def _folder(self, folders: list[str], *, create: bool) -> int: ...

    def kept_with(self, name: str) -> frozenset[str]: ...


def put_object(store: FileStore, name: str, parts: Sequence[Part]) -> None:
    """`FileStore.put`: a full disk under a bound makes room once, then writes again."""
    folders, leaf = store._split(name)
    folder = store._folder(folders, create=True)
    try:
        try:
            _put(store, folder, leaf, name, parts)
        except CapacityFull:
            raise
        except OSError as e:
            if e.errno != errno.ENOSPC or store.bound is None:
                raise
            held = store.bound.held()[0]
            size = sum(map(part_bytes, parts))
            margin = max(size, (store.capacity_bytes or 0) - store.target_bytes)
            store.bound.evict(held - margin, store.kept_with(name))
            _put(store, folder, leaf, name, parts)
    finally:
        os.close(folder)


def _put(store: FileStore, folder: int, leaf: str, name: str, parts: Sequence[Part]) -> None:
    tmp = f"{TEMPORARY}{secrets.token_hex(8)}"
    fd = os.open(tmp, WRITE_FLAGS, 0o600, dir_fd=folder)  # refused: nothing of ours to remove
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            views = bytes_views(parts)
            size = sum(v.nbytes for v in views)
            while views:  # one gathering write per IOV_MAX parts, however partial
                views = advance(views, os.writev(f.fileno(), views[:IOV_MAX]))
            now = time.time_ns()  # its first use, to the nanosecond (the file system's
            os.utime(f.fileno(), ns=(now, now))  # own clock ticks in milliseconds)
        with _room(store, size, name):
            try:
                os.replace(tmp, leaf, src_dir_fd=folder, dst_dir_fd=folder)
            except IsADirectoryError:
                raise failed_write(store, name, errno.EISDIR) from None
        store.counters.add(writes=1, written_bytes=size)
    except BaseException:  # the temporary this call made (O_EXCL), under the name it drew
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def _room(store: FileStore, size: int, name: str) -> contextlib.AbstractContextManager[None]:
    """Where the store is bounded: room for `size` more bytes, for the block."""
    if store.bound is None:
        return contextlib.nullcontext()
    return store.bound.admit(size, store.target_bytes, store.kept_with(name), name)


def put_objects(
    store: FileStore,
    objects: Sequence[tuple[str, Sequence[Part]]],
    tables: Sequence[int] | None = None,
    units: Sequence[int] | None = None,
) -> None:
    """`FileStore.put_many`: each object as `_put` writes it, in one `_fileio.write_objects`
    call on the store's threads (with `tables`, each unit summed into its object's header as
    it is written, its parts cut into `units` where given: `UnitsWriter.put_many`); each
    folder opened (made where missing) once,
    below the root with no link followed. A bounded store renames them in afterwards, under
    one admission of their bytes (`_put_bounded`)."""
    held: dict[tuple[str, ...], int] = {}
    sizes = [sum(map(part_bytes, parts)) for _, parts in objects]
    try:
        split = [store._split(name) for name, _ in objects]
        for folders, _ in split:
            if tuple(folders) not in held:
                held[tuple(folders)] = store._folder(folders, create=True)
        fds = np.array([held[tuple(folders)] for folders, _ in split], np.int32)
        tmps = [f"{TEMPORARY}{secrets.token_hex(8)}" for _ in objects]
        leaves = [leaf for _, leaf in split]
        batch = Batch(fds, tmps, [p for _, p in objects], tables, units)
        if store.bound is None:
            errors = batch.write(store, range(len(objects)), leaves)
        else:
            errors = _put_bounded(store, batch, [n for n, _ in objects], leaves, sizes)
    finally:
        for fd in held.values():
            os.close(fd)
    done = [size for size, error in zip(sizes, errors, strict=True) if not error]
    store.counters.add(writes=len(done), written_bytes=sum(done))
    if failed := next(((n, e) for (n, _), e in zip(objects, errors, strict=True) if e), None):
        raise failed_write(store, *failed)


@dataclass(frozen=True)
class Batch:
    """A batch's objects: each one's folder, temporary name, parts, and digest table (all
    or none) with the units their parts are cut into (`UnitsWriter.put_many`)."""

    fds: np.ndarray
    tmps: list[str]
    parts: list[Sequence[Part]]
    tables: Sequence[int] | None
    units: Sequence[int] | None

    def write(self, store: FileStore, which: Sequence[int], leaves: list[str] | None) -> list[int]:
        """Objects `which` written in one native call, renamed over `leaves` (None: left at
        their temporary names); each one's errno, 0 where written."""
        at = list(which)
        tmps, parts = [self.tmps[i] for i in at], [self.parts[i] for i in at]
        names = None if leaves is None else [leaves[i] for i in at]
        if self.tables is None:
            return list(write_objects(self.fds[at], tmps, names, parts, store.threads))
        tables = np.asarray(self.tables, np.int64)[at]
        cut = None if self.units is None else np.asarray(self.units, np.int64)
        return list(
            write_objects(self.fds[at], tmps, names, parts, store.threads, tables, CHECK_AT, cut)
        )


def _put_bounded(
    store: FileStore, batch: Batch, names: list[str], leaves: list[str], sizes: list[int]
) -> list[int]:
    """A bounded store's batch (of one namespace): every object written to its temporary
    file in one native call (a full disk makes room once, as `put_object` does, and those
    are written again), then all renamed over their names inside one admission of their
    bytes (`Bound.admit`: room made under the folder's lock, as for one); each object's
    errno, 0 where stored; no temporary file stays."""
    bound = store.bound
    assert bound is not None
    errors = batch.write(store, range(len(names)), None)
    if full := [i for i, e in enumerate(errors) if e == errno.ENOSPC]:
        size = sum(sizes[i] for i in full)
        margin = max(size, (store.capacity_bytes or 0) - store.target_bytes)
        keep = frozenset().union(*(store.kept_with(names[i]) for i in full))
        bound.evict(bound.held()[0] - margin, keep)
        for i, error in zip(full, batch.write(store, full, None), strict=True):
            errors[i] = error
    written, renamed = [i for i, e in enumerate(errors) if not e], set()
    try:
        if written:
            keep = frozenset().union(*(store.kept_with(names[i]) for i in written))
            size = sum(sizes[i] for i in written)
            with bound.admit(size, store.target_bytes, keep, names[written[0]], len(written)):
                for i in written:
                    fd = int(batch.fds[i])
                    try:
                        os.replace(batch.tmps[i], leaves[i], src_dir_fd=fd, dst_dir_fd=fd)
                        renamed.add(i)
                    except OSError as e:
                        errors[i] = e.errno or errno.EIO
    finally:  # the temporaries this call made (O_EXCL), under the names it drew
        for i in set(written) - renamed:
            with contextlib.suppress(OSError):
                os.unlink(batch.tmps[i], dir_fd=int(batch.fds[i]))
    return errors


def failed_write(store: FileStore, name: str, code: int) -> OSError:
    """The error of a write of `name` that failed with `code`. A write renames its file over
    whatever holds the name (a damaged object, a FIFO, a link: each replaced, none opened),
    but a folder cannot be: that one says which, for an operator to remove."""
    said = f"{name}: {os.strerror(code)}"
    if code == errno.EISDIR:
        path = store.root / name
        said += f": {path} is a folder, not a file (the store replaces no folder: remove it)"
    return OSError(code, said)
