"""Many objects' headers checked at once: a run of pages read in one call
(`pipeline.engine.l3.batch`) has its headers side by side, one per row, and numpy compares
them with the one header they must each be, where `unit_digests` would parse a page at a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.core.l3 import (
    CHECK_AT,
    HEADER,
    UNIT_BYTES,
    Checks,
    PageObject,
    header,
    table_at,
    unit_digests,
)


def header_rows(
    rows: np.ndarray, obj: PageObject, space: str, names: Sequence[str], checks: Checks
) -> tuple[np.ndarray, np.ndarray]:
    """Whether each row of `rows` (uint8, one per object of `names`, each as long as its
    header) is exactly the header of its object as `unit_digests` says, and each row's digest
    table (a row per object; a row whose header is not intact holds no meaning). Unkeyed CRC-32C
    checks only (a keyed digest does not fit the table's 64 bits); in bulk where the names are
    of one length, a row at a time otherwise."""
    assert checks.key is None, "keyed headers are read a page at a time"
    count, units = len(names), len(obj.units)
    if not count or len({len(n) for n in names}) > 1:
        return _one_by_one(rows, obj, space, names, checks)
    lengths = [u.page_bytes for u in obj.units]
    template = np.frombuffer(header(space, names[0], [0] * units, lengths, checks), np.uint8)
    if rows.shape[1] != len(template):
        return np.zeros(count, bool), np.zeros((count, units), np.uint64)
    name_at = HEADER.size + len(space.encode())
    name_end = name_at + len(names[0].encode())
    table, row = table_at(space, names[0]), checks.width + UNIT_BYTES.size
    digests = np.ascontiguousarray(rows[:, table:]).view("<u4").reshape(count, units, 2)
    fixed = np.ones(len(template), bool)
    fixed[CHECK_AT : HEADER.size] = False
    fixed[name_at:name_end] = False
    fixed[table:].reshape(units, row)[:, : checks.width] = False  # the digests
    ok = (rows[:, fixed] == template[fixed]).all(axis=1)
    wanted = np.frombuffer("".join(names).encode(), np.uint8).reshape(count, -1)
    ok &= (rows[:, name_at:name_end] == wanted).all(axis=1)
    zeroed = rows.copy()
    zeroed[:, CHECK_AT : HEADER.size] = 0  # the check covers the header with itself zero
    unit = checks.unit()  # the header's own check, as `header_check` takes it
    sums = np.array([unit(r.data) for r in zeroed], np.uint64)
    stored = np.ascontiguousarray(rows[:, CHECK_AT : HEADER.size]).view("<u8")
    ok &= (stored[:, 0] == sums) & (stored[:, 1] == 0)
    return ok, digests[:, :, 0].astype(np.uint64)


def headers_of(
    space: str,
    names: Sequence[str],
    digests: np.ndarray,
    unit_bytes: Sequence[int],
    checks: Checks,
) -> list[memoryview]:
    """Each object's header as `header` makes it, its units' digests a row of `digests`
    (uint32, a row per object): in bulk where the names are of one length (a copy of one
    header, each with its name, digests and check put in), else one at a time. Each is
    writable (a store that sums units fills the digests and check in). Unkeyed checks only."""
    assert checks.key is None, "keyed headers are written a page at a time"
    encoded = [name.encode() for name in names]
    count, units = len(names), len(unit_bytes)
    if len({len(n) for n in encoded}) != 1:
        return [
            memoryview(bytearray(header(space, n, row, unit_bytes, checks)))
            for n, row in zip(names, digests.tolist(), strict=True)
        ]
    template = np.frombuffer(header(space, names[0], [0] * units, unit_bytes, checks), np.uint8)
    rows = np.tile(template, (count, 1))
    name_at = HEADER.size + len(space.encode())
    rows[:, name_at : name_at + len(encoded[0])] = np.frombuffer(
        b"".join(encoded), np.uint8
    ).reshape(count, -1)
    table, row = table_at(space, names[0]), checks.width + UNIT_BYTES.size
    sums = np.ascontiguousarray(digests, "<u4").view(np.uint8).reshape(count, units, 4)
    rows[:, table:].reshape(count, units, row)[:, :, : checks.width] = sums
    rows[:, CHECK_AT : HEADER.size] = 0  # the check covers the header with itself zero
    unit = checks.unit()
    checked = np.array([unit(r.data) for r in rows], "<u8")
    rows[:, CHECK_AT : CHECK_AT + 8] = checked.view(np.uint8).reshape(count, 8)
    return [r.data for r in rows]


def _one_by_one(
    rows: np.ndarray, obj: PageObject, space: str, names: Sequence[str], checks: Checks
) -> tuple[np.ndarray, np.ndarray]:
    ok, tables = np.zeros(len(names), bool), np.zeros((len(names), len(obj.units)), np.uint64)
    for i, name in enumerate(names):
        size = obj.header_size(space, name, checks)
        table = unit_digests(rows[i, :size].data, obj, space, name, checks)
        if table is not None:
            ok[i], tables[i] = True, table
    return ok, tables
