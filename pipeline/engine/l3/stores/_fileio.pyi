"""Types of the compiled `_fileio.c` (see its comment)."""

from collections.abc import Callable, Sequence

import numpy as np

CHUNK: int
"""Bytes read at a time, each chunk summed while still in the CPU's cache."""
SUM: str
"""How reads sum CRC-32C on this CPU: one of SUMS, the fastest it has (timed at import)."""
SUMS: tuple[str, ...]
"""Every sum the module knows; a CPU may lack some (x86-64's instructions)."""

def read_objects(
    files: tuple[int, Sequence[str]] | np.ndarray,
    sizes: np.ndarray,
    used: bool,
    objects: np.ndarray,
    offsets: np.ndarray,
    addresses: np.ndarray,
    nbytes: np.ndarray,
    crcs: np.ndarray,
    ends: np.ndarray,
    threads: int,
    on_group: Callable[[int], bool] | None = None,
    rows: np.ndarray | None = None,
    pitches: np.ndarray | None = None,
) -> tuple[int, int]: ...
def present(files: tuple[int, Sequence[str]], threads: int) -> list[bool]: ...
def crc32c(data: bytes | bytearray | memoryview, crc: int = 0, how: str = "") -> int: ...
def crcs_of(buffers: Sequence[bytes | bytearray | memoryview], threads: int = 1) -> list[int]: ...
def crcs_at(
    addresses: np.ndarray, nbytes: np.ndarray, crcs: np.ndarray, threads: int = 1
) -> None: ...
def write_objects(
    folders: np.ndarray,
    tmps: Sequence[str],
    leaves: Sequence[str] | None,
    objects: Sequence[Sequence[bytes | bytearray | memoryview]],
    threads: int,
    tables: np.ndarray | None = None,
    check_at: int = 0,
    units: np.ndarray | None = None,
) -> list[int]: ...
