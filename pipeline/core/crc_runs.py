"""Checking units read end to end with one CRC call: the combined CRC-32C of their own CRCs."""

from __future__ import annotations

from collections.abc import Sequence

import crc32c
import numpy as np

Matrix = list[int]
"""A linear map of 32 bits as its 32 columns: the image of each bit."""
IDENTITY: Matrix = [1 << bit for bit in range(32)]
BYTES = np.arange(4, dtype=np.uint32) * 8
"""Where each of a CRC's four bytes starts."""


class CrcRuns:
    """The CRC-32C of units laid end to end, from each unit's own CRC-32C. crc(A + B) is
    crc(A) shifted over len(B) zero bytes, xor crc(B), and that shift is a linear map of 32
    bits; so the whole run's CRC is the xor of each unit's CRC shifted over the bytes after it.
    Those shifts depend only on the units' sizes: per list of sizes, each unit's shift is kept
    as four byte tables, and combining a page's CRCs is a few numpy calls (a Python loop per
    unit, 61 of them a page, held Python's lock longer than reading the page took). A run of
    units read into one buffer is then checked with one CRC call over it, outside the lock
    (each call is a turn of the lock between the I/O threads: 61 per object made 16 threads
    slower than 4), whatever the units' sizes."""

    def __init__(self) -> None:
        self._plans: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._shifts: dict[int, Matrix] = {}

    def check(self, span: memoryview, crcs: Sequence[int], sizes: Sequence[int]) -> bool:
        """Whether `span` holds the units whose CRCs and sizes are given, end to end (one
        CRC call, outside Python's lock)."""
        return crc32c.crc32c(span) == self(crcs, sizes)

    def __call__(self, crcs: Sequence[int], sizes: Sequence[int]) -> int:
        """The CRC-32C of the units whose CRCs and sizes are given, in order."""
        if len(crcs) == 1:
            return crcs[0]
        key = tuple(sizes)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(key)
        tables, first = plan
        at = first + ((np.asarray(crcs, dtype=np.uint32)[:, None] >> BYTES) & 255)
        return int(np.bitwise_xor.reduce(tables[at], axis=None))

    def _plan(self, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Per unit, the byte tables (4 x 256) of its shift over the bytes after it, all in
        one flat array, and where each unit's four tables start in it."""
        shift, found = IDENTITY, []
        for after in reversed((*sizes[1:], 0)):  # the last unit's shift is over nothing
            shift = compose(self._shift(after), shift) if after else shift
            found.append(byte_tables(shift))
        first = (np.arange(len(sizes))[:, None] * 4 + np.arange(4)) * 256
        return np.stack(found[::-1]).ravel(), first

    def _shift(self, size: int) -> Matrix:
        """The shift over `size` zero bytes."""
        if size not in self._shifts:
            zeros = bytes(size)
            offset = crc32c.crc32c(zeros, 0)  # crc32c(zeros, x) is this map of x, xor offset
            self._shifts[size] = [crc32c.crc32c(zeros, 1 << bit) ^ offset for bit in range(32)]
        return self._shifts[size]


def apply(matrix: Matrix, x: int) -> int:
    found = 0
    while x:
        low = x & -x
        found ^= matrix[low.bit_length() - 1]
        x ^= low
    return found


def compose(outer: Matrix, inner: Matrix) -> Matrix:
    """The map `inner` then `outer`."""
    return [apply(outer, column) for column in inner]


def byte_tables(matrix: Matrix) -> np.ndarray:
    """The map as four tables of 256, one per byte of its input: the xor of the four
    looked-up values is the map of the whole input."""
    columns = np.array(matrix, dtype=np.uint32).reshape(4, 8)
    bits = (np.arange(256, dtype=np.uint32)[:, None] >> np.arange(8, dtype=np.uint32)) & 1
    picked = np.where(bits[None, :, :] == 1, columns[:, None, :], np.uint32(0))
    return np.bitwise_xor.reduce(picked, axis=2)
