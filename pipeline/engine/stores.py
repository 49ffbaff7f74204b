"""L3 object stores: a folder on local disk, and Mooncake Store.

A store moves opaque blobs by name; what a blob means, and whether it is intact, is
`pipeline.spec.l3`'s business. A read that fails for any reason is a miss (None), never an
error in the middle of a transfer; only opening a store can fail loudly.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from pipeline.spec.storage import StorageConfig, StorageKind


class ObjectStore(Protocol):
    """Blobs by name."""

    def put(self, name: str, blob: bytes) -> None:
        """Store `blob` under `name` (replacing what was there)."""

    def get(self, name: str) -> bytearray | None:
        """The blob under `name` (writable, so tensors can view it), or None (absent, or
        unreadable)."""

    def exists(self, names: list[str]) -> list[bool]:
        """Whether each name holds a blob."""

    def remove(self, names: list[str]) -> None:
        """Drop these blobs (absent ones are fine)."""

    def close(self) -> None:
        """Let go of the store's resources."""


class FileStore:
    """One file per object under a folder; a write lands whole or not at all (a temporary
    file in the same folder, then a rename)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        return self.root / name

    def put(self, name: str, blob: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, name: str) -> bytearray | None:
        try:
            with self._path(name).open("rb") as f:
                blob = bytearray(os.fstat(f.fileno()).st_size)
                return blob if f.readinto(blob) == len(blob) else None
        except OSError:
            return None

    def exists(self, names: list[str]) -> list[bool]:
        return [self._path(n).is_file() for n in names]

    def remove(self, names: list[str]) -> None:
        for name in names:
            self._path(name).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class MooncakeStore:
    """A Mooncake Store client over TCP (RDMA where the machine has it), lending
    `segment_bytes` of this process's memory to the store."""

    def __init__(self, master: str, metadata_server: str, segment_bytes: int) -> None:
        try:
            from mooncake.store import MooncakeDistributedStore  # only where mooncake is used
        except ImportError as e:
            raise RuntimeError(
                "storage.kind=mooncake needs the mooncake-transfer-engine package and the "
                f"libibverbs1 system library (see README, L3 tier): {e}"
            ) from e
        self.client: Any = MooncakeDistributedStore()
        status = self.client.setup(
            "127.0.0.1", metadata_server, segment_bytes, 16 << 20, "tcp", "", master
        )
        if status != 0:
            raise RuntimeError(
                f"cannot join the Mooncake master at {master} (metadata {metadata_server}): "
                f"setup returned {status}"
            )

    def put(self, name: str, blob: bytes) -> None:
        status = self.client.upsert(name, blob)
        if status != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {status}")

    def get(self, name: str) -> bytearray | None:
        try:
            blob = self.client.get(name)
        except Exception:  # an unreachable master or peer: a miss
            return None
        return bytearray(blob) if blob else None

    def exists(self, names: list[str]) -> list[bool]:
        try:
            return [flag == 1 for flag in self.client.batch_is_exist(names)]
        except Exception:
            return [False] * len(names)

    def remove(self, names: list[str]) -> None:
        for name in names:
            self.client.remove(name)

    def close(self) -> None:
        self.client.close()


def open_store(config: StorageConfig) -> ObjectStore:
    """The store a config names (its master and folder already resolved by the job)."""
    if config.kind is StorageKind.file:
        assert config.path is not None, "the job gives a file store its folder"
        return FileStore(config.path)
    assert config.kind is StorageKind.mooncake and config.metadata_server is not None
    return MooncakeStore(config.master, config.metadata_server, config.segment_bytes)
