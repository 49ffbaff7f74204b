"""The buffers a blob is written from and read into."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

Part: TypeAlias = bytes | bytearray | memoryview
"""A buffer a blob is written from (a header, or a page's bytes in host memory)."""
IOV_MAX = 1024
"""The most buffers one readv/writev takes (Linux)."""


Range: TypeAlias = tuple[int, Sequence[memoryview]]
"""Where in a blob a read starts, and the buffers its bytes fill in order from there."""
Check: TypeAlias = Callable[[int], bool]
"""Called with each range's index once its buffers are filled (while they are still in the
CPU's cache); False ends the read as a miss."""


def advance(views: list[memoryview], done: int) -> list[memoryview]:
    """`views` without their first `done` bytes."""
    while views and done >= views[0].nbytes:
        done -= views[0].nbytes
        views = views[1:]
    return [views[0][done:], *views[1:]] if views and done else views


def bytes_views(parts: Sequence[Part]) -> list[memoryview]:
    return [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
