"""L3 object stores: a folder on local disk, and Mooncake Store.

A store moves opaque blobs by name; what a blob means, and whether it is intact, is
`pipeline.spec.l3`'s business. A read that fails for any reason is a miss (None, False), never
an error in the middle of a transfer; opening a store and writing to it can fail loudly.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np

from pipeline.spec.storage import StorageConfig, StorageKind

Part: TypeAlias = bytes | bytearray | memoryview
"""A buffer a blob is written from (a header, or a page's bytes in host memory)."""
IOV_MAX = 1024
"""The most buffers one readv/writev takes (Linux)."""
OBJECT_NOT_FOUND = -704
"""Mooncake's error code for a name that holds nothing."""


class ObjectStore(Protocol):
    """Blobs by name. A blob is written from, and read into, a list of buffers (a header and
    a payload): no joining copy."""

    def put(self, name: str, parts: Sequence[Part]) -> None:
        """Store the parts' bytes, in order, as one blob under `name` (replacing what was
        there)."""

    def get(self, name: str) -> bytes | None:
        """The blob under `name`, or None (absent, or unreadable)."""

    def get_into(self, name: str, parts: Sequence[memoryview]) -> bool:
        """Fill `parts`, in order, with the blob under `name`; False unless it is there and
        exactly as long as the parts together (what the parts then hold is undefined)."""

    def exists(self, names: list[str]) -> list[bool]:
        """Whether each name holds a blob."""

    def remove(self, names: list[str]) -> None:
        """Drop these blobs (absent ones are fine)."""

    def close(self) -> None:
        """Let go of the store's resources."""


def _advance(views: list[memoryview], done: int) -> list[memoryview]:
    """`views` without their first `done` bytes."""
    while views and done >= views[0].nbytes:
        done -= views[0].nbytes
        views = views[1:]
    return [views[0][done:], *views[1:]] if views and done else views


def _bytes_views(parts: Sequence[Part]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]


class FileStore:
    """One file per object under a folder; a write lands whole or not at all (a temporary
    file in the same folder, then a rename)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        return self.root / name

    def put(self, name: str, parts: Sequence[Part]) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                views = _bytes_views(parts)
                while views:  # one gathering write per IOV_MAX parts, however partial
                    views = _advance(views, os.writev(f.fileno(), views[:IOV_MAX]))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except OSError:
            return None

    def get_into(self, name: str, parts: Sequence[memoryview]) -> bool:
        views = _bytes_views(parts)
        try:
            with self._path(name).open("rb", buffering=0) as f:
                if os.fstat(f.fileno()).st_size != sum(v.nbytes for v in views):
                    return False
                while views:  # one scattering read per IOV_MAX parts
                    got = os.readv(f.fileno(), views[:IOV_MAX])
                    if got == 0:
                        return False
                    views = _advance(views, got)
                return True
        except OSError:
            return False

    def exists(self, names: list[str]) -> list[bool]:
        return [self._path(n).is_file() for n in names]

    def remove(self, names: list[str]) -> None:
        for name in names:
            self._path(name).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class MooncakeStore:
    """A Mooncake Store client over TCP (RDMA where the machine has it), lending
    `segment_bytes` of this process's memory to the store. Every put and get passes through
    the client's own buffer of `buffer_bytes` (a put finding it full fails)."""

    def __init__(
        self, master: str, metadata_server: str, segment_bytes: int, buffer_bytes: int
    ) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore  # only where mooncake is used
        except ImportError as e:
            raise RuntimeError(
                "storage.kind=mooncake needs the mooncake-transfer-engine package and the "
                f"libibverbs1 system library (see README, L3 tier): {e}"
            ) from e
        self.client: Any = MooncakeDistributedStore()
        status = self.client.setup(
            "127.0.0.1", metadata_server, segment_bytes, buffer_bytes, "tcp", "", master
        )
        if status != 0:
            raise RuntimeError(
                f"cannot join the Mooncake master at {master} (metadata {metadata_server}): "
                f"setup returned {status}"
            )

    def put(self, name: str, parts: Sequence[Part]) -> None:
        status = self.client.upsert_parts(name, *_bytes_views(parts))
        if status != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {status}")

    def get(self, name: str) -> bytes | None:
        try:
            blob = self.client.get(name)
        except Exception:  # an unreachable master or peer: a miss
            return None
        return blob or None

    def get_into(self, name: str, parts: Sequence[memoryview]) -> bool:
        blob = self.get(name)
        views = _bytes_views(parts)
        if blob is None or len(blob) != sum(v.nbytes for v in views):
            return False
        first = 0
        for view in views:  # numpy copies outside Python's lock
            np.frombuffer(view, np.uint8)[:] = np.frombuffer(blob, np.uint8, view.nbytes, first)
            first += view.nbytes
        return True

    def exists(self, names: list[str]) -> list[bool]:
        try:
            return [flag == 1 for flag in self.client.batch_is_exist(names)]
        except Exception:
            return [False] * len(names)

    def remove(self, names: list[str]) -> None:
        for name in names:  # forced: a read's lease would keep the object for a while
            status = self.client.remove(name, force=True)
            if status not in (0, OBJECT_NOT_FOUND):
                raise RuntimeError(f"Mooncake remove of {name} returned {status}")

    def close(self) -> None:
        self.client.close()


def open_store(config: StorageConfig, largest_object: int = 1 << 20) -> ObjectStore:
    """The store a config names (its master and folder already resolved by the job), for
    objects of at most `largest_object` bytes moved `storage.io_threads` at a time."""
    if config.kind is StorageKind.file:
        assert config.path is not None, "the job gives a file store its folder"
        return FileStore(config.path)
    assert config.kind is StorageKind.mooncake and config.metadata_server is not None
    in_flight = 2 * config.io_threads * largest_object  # puts and gets stage through it
    return MooncakeStore(
        config.master, config.metadata_server, config.segment_bytes, max(in_flight, 16 << 20)
    )
