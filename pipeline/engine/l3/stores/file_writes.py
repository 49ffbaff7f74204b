"""The file store's writes: each object a temporary file in its folder, written whole, then
renamed over its name (a reader sees all of it or none), every step relative to the folder's
descriptor. One at a time (`put_object`: where the store is bounded, room is made for each
inside its rename), or many in one native call on the store's threads (`put_objects`)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.core.l3 import CHECK_AT
from pipeline.engine.l3.stores._fileio import write_objects
from pipeline.engine.l3.stores.capacity import Bound, CapacityFull
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.owned import TEMPORARY
from pipeline.engine.l3.stores.parts import IOV_MAX, Part, advance, bytes_views

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
            size = sum(memoryview(p).nbytes for p in parts)
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
) -> None:
    """`FileStore.put_many` (an unbounded store): each object as `_put` writes it, in one
    `_fileio.write_objects` call on the store's threads (with `tables`, each unit summed into
    its object's header as it is written: `UnitsWriter.put_many`); each folder opened (made
    where missing) once, below the root with no link followed."""
    held: dict[tuple[str, ...], int] = {}
    try:
        split = [store._split(name) for name, _ in objects]
        for folders, _ in split:
            if tuple(folders) not in held:
                held[tuple(folders)] = store._folder(folders, create=True)
        fds = np.array([held[tuple(folders)] for folders, _ in split], np.int32)
        tmps = [f"{TEMPORARY}{secrets.token_hex(8)}" for _ in objects]
        leaves = [leaf for _, leaf in split]
        sums = () if tables is None else (np.asarray(tables, np.int64), CHECK_AT)
        errors = write_objects(fds, tmps, leaves, [p for _, p in objects], store.threads, *sums)
    finally:
        for fd in held.values():
            os.close(fd)
    sizes = [sum(memoryview(p).nbytes for p in parts) for _, parts in objects]
    done = [size for size, error in zip(sizes, errors, strict=True) if not error]
    store.counters.add(writes=len(done), written_bytes=sum(done))
    if failed := next(((n, e) for (n, _), e in zip(objects, errors, strict=True) if e), None):
        raise failed_write(store, *failed)


def failed_write(store: FileStore, name: str, code: int) -> OSError:
    """The error of a write of `name` that failed with `code`. A write renames its file over
    whatever holds the name (a damaged object, a FIFO, a link: each replaced, none opened),
    but a folder cannot be: that one says which, for an operator to remove."""
    said = f"{name}: {os.strerror(code)}"
    if code == errno.EISDIR:
        path = store.root / name
        said += f": {path} is a folder, not a file (the store replaces no folder: remove it)"
    return OSError(code, said)
