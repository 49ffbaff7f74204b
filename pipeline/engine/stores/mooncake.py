"""Mooncake Store: objects in the segments that the ranks lend a Mooncake master."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.engine.stores.parts import Check, Part, Range, bytes_views

OBJECT_NOT_FOUND = -704
"""Mooncake's error code for a name that holds nothing."""


class MooncakeStore:
    """A Mooncake Store client over TCP (RDMA where the machine has it), lending
    `segment_bytes` of this process's memory to the store. Puts pass through the client's own
    buffer of `buffer_bytes` (a put finding it full fails); reads land in `num_staging`
    buffers registered with the client (`get_into`: no allocation per object), from which
    each range is copied into its pool rows."""

    def __init__(
        self,
        master: str,
        metadata_server: str,
        segment_bytes: int,
        buffer_bytes: int,
        *,
        staging_bytes: int,
        num_staging: int,
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
        self._staging: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._registered: list[np.ndarray] = []
        for _ in range(num_staging):
            buf = np.empty(staging_bytes, dtype=np.uint8)
            if self.client.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
                raise RuntimeError(f"Mooncake refused to register a {staging_bytes} B buffer")
            self._registered.append(buf)
            self._staging.put(buf)

    def put(self, name: str, parts: Sequence[Part]) -> None:
        status = self.client.upsert_parts(name, *bytes_views(parts))
        if status != 0:
            raise RuntimeError(f"Mooncake put of {name} returned {status}")

    def read(
        self, name: str, size: int, ranges: Sequence[Range], check: Check | None = None
    ) -> bool:
        staging = self._staging.get()
        try:
            if size > staging.nbytes:
                return False
            if self.client.get_into(name, staging.ctypes.data, size) != size:
                return False
            for i, (offset, buffers) in enumerate(ranges):
                at = offset
                for view in buffers:  # numpy copies outside Python's lock
                    np.frombuffer(view, np.uint8)[:] = staging[at : at + view.nbytes]
                    at += view.nbytes
                if check is not None and not check(i):
                    return False
            return True
        except Exception:  # an unreachable master or peer: a miss
            return False
        finally:
            self._staging.put(staging)

    def get(self, name: str) -> bytes | None:
        try:
            blob = self.client.get(name)
        except Exception:  # an unreachable master or peer: a miss
            return None
        return blob or None

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
        for buf in self._registered:
            self.client.unregister_buffer(buf.ctypes.data)
        self.client.close()
