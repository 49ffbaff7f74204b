"""Checking units read end to end with one CRC call: the combined CRC-32C of their own CRCs."""

from __future__ import annotations

from collections.abc import Sequence

import crc32c


class CrcRuns:
    """The CRC-32C of units laid end to end, from each unit's own CRC-32C: crc(A + B) is
    crc(A) shifted over len(B) zero bytes, xor crc(B), and that shift is a linear map of 32
    bits, kept per length as four byte tables. A run of units read into one buffer is then
    checked with one CRC call over it (each call is a turn of Python's lock between the I/O
    threads: 61 per object made 16 threads slower than 4), whatever the units' sizes."""

    def __init__(self) -> None:
        self._shifts: dict[int, list[list[int]]] = {}

    def check(self, span: memoryview, crcs: Sequence[int], sizes: Sequence[int]) -> bool:
        """Whether `span` holds the units whose CRCs and sizes are given, end to end (one
        CRC call, outside Python's lock)."""
        return crc32c.crc32c(span) == self(crcs, sizes)

    def __call__(self, crcs: Sequence[int], sizes: Sequence[int]) -> int:
        """The CRC-32C of the units whose CRCs and sizes are given, in order."""
        found = crcs[0]
        for crc, size in zip(crcs[1:], sizes[1:], strict=True):
            t = self._shifts.get(size) or self._tables(size)
            x = found
            found = t[0][x & 255] ^ t[1][x >> 8 & 255] ^ t[2][x >> 16 & 255] ^ t[3][x >> 24] ^ crc
        return found

    def _tables(self, size: int) -> list[list[int]]:
        zeros = bytes(size)
        offset = crc32c.crc32c(zeros, 0)  # the map's columns: shifts of each bit, less this
        columns = [crc32c.crc32c(zeros, 1 << bit) ^ offset for bit in range(32)]
        tables = []
        for k in range(4):
            table = [0] * 256
            for b in range(1, 256):
                low = (b & -b).bit_length() - 1
                table[b] = table[b & (b - 1)] ^ columns[8 * k + low]
            tables.append(table)
        self._shifts[size] = tables
        return tables
