"""Types of the compiled `_fileio.c` (see its comment)."""

import numpy as np

CHUNK: int
"""Bytes read at a time, each chunk summed while still in the CPU's cache."""

def read_into(
    fds: np.ndarray, offsets: np.ndarray, addresses: np.ndarray, sizes: np.ndarray, crcs: np.ndarray
) -> int: ...
def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...
