"""L3 objects: content addresses for token prefixes, who writes and reads which object, and a
self-checking object format.

A page's key is a hash chain over the token ids of every page up to it (as the prefix caches of
SGLang, vLLM and LMCache key theirs), inside a namespace that pins the model geometry, KV dtype
and page size: a key names a whole prefix, and two incompatible caches can never share one.
Each page has one object per writer: all its units under replicated and single_source, one
layer group per owner under rotating; so a page's bytes are written once per replica group.
An object carries a header (magic, format version, namespace, name, length, CRC-32); anything
that does not match is a miss, never bytes.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.spec.model import ModelGeometry, Unit
from pipeline.spec.ownership import OwnerMap, Ownership
from pipeline.spec.topology import Topology

FORMAT_VERSION = 1
MAGIC = b"HCPL3"
HEADER = struct.Struct("<5sHHHQI")
"""magic, format version, namespace length, name length, payload length, payload CRC-32."""


def namespace(model: ModelGeometry) -> str:
    """The objects of one model geometry (name, KV dtype, page size, every unit's shape)."""
    units = [(u.ordinal, u.layer, u.pool, u.rows_per_page, u.row_bytes) for u in model.units]
    identity = repr((model.name, model.kv_dtype.value, model.page_size, units))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return f"v{FORMAT_VERSION}-{model.kv_dtype.value}-p{model.page_size}-{digest}"


def prefix_keys(tokens: Sequence[int] | np.ndarray, slots_per_page: int, space: str) -> list[str]:
    """One key per page: SHA-256 over the previous page's key and this page's token ids, from
    the namespace on, so each key stands for the whole prefix that ends with its page."""
    ids = np.asarray(tokens, dtype=np.int64)
    if len(ids) % slots_per_page:
        raise ValueError(
            f"{len(ids)} token ids are not whole pages of {slots_per_page} (page_size x dcp_size)"
        )
    chain = hashlib.sha256(space.encode()).digest()
    keys = []
    for first in range(0, len(ids), slots_per_page):
        chain = hashlib.sha256(chain + ids[first : first + slots_per_page].tobytes()).digest()
        keys.append(chain.hex()[:32])
    return keys


KEY = re.compile(r"[0-9a-f]{32}")
"""What `prefix_keys` makes (and all an object name may hold of a caller's key)."""


def check_keys(keys: Sequence[str], num_pages: int) -> None:
    """ValueError unless `keys` are one key per page, each as `prefix_keys` makes them."""
    if len(keys) != num_pages:
        raise ValueError(f"{len(keys)} keys for {num_pages} pages: pass one key per page")
    bad = [k for k in keys if not isinstance(k, str) or not KEY.fullmatch(k)]
    if bad:
        raise ValueError(f"keys {bad[:3]!r} are not page keys (32 hex digits, see Engine.l3_keys)")


@dataclass(frozen=True)
class ObjectSpec:
    """One object of every page: the units it holds, the rank that writes it, the ranks that
    read it."""

    suffix: str
    """Its name after the page key: 'all', or 'g<j>of<n>' (layer group j of n), then the
    share of the attention group's KV it holds, if any (see `share_of`)."""
    units: tuple[Unit, ...]
    writer: int
    readers: tuple[int, ...]

    def name(self, space: str, key: str) -> str:
        return f"{space}/{key[:2]}/{key}/{self.suffix}"

    @property
    def page_bytes(self) -> int:
        return sum(u.page_bytes for u in self.units)

    @functools.cached_property
    def unit_runs(self) -> tuple[tuple[Unit, ...], ...]:
        """Its units in order, cut where the pool kind changes (a pool may stack each run)."""
        runs: list[list[Unit]] = []
        for unit in self.units:
            if runs and runs[-1][-1].pool == unit.pool:
                runs[-1].append(unit)
            else:
                runs.append([unit])
        return tuple(tuple(run) for run in runs)


def share_of(topology: Topology, model: ModelGeometry, rank: int) -> str:
    """'' where `rank`'s replica group holds all of its attention group's KV (MLA without
    DCP); else which share it holds, '-s<i>of<n>' (a DCP shard, or an MHA rank's heads), so
    different bytes of one prefix never share an object."""
    shares = sorted({topology.replica_group(r, model) for r in topology.attn_group(rank)})
    if len(shares) == 1:
        return ""
    return f"-s{shares.index(topology.replica_group(rank, model))}of{len(shares)}"


def object_specs(
    ownership: Ownership, owners: OwnerMap, units: tuple[Unit, ...], share: str
) -> tuple[ObjectSpec, ...]:
    """Every object of a page for one replica group. replicated: one object, written by the
    group's first rank, read by every rank; single_source: the same, read by the first rank
    alone; rotating: one per owner's layer group, written and read by its owner."""
    group = owners.group
    if ownership is not Ownership.rotating:
        readers = group if ownership is Ownership.replicated else group[:1]
        return (ObjectSpec(f"all{share}", units, group[0], readers),)
    n = len(group)
    specs = []
    for j, rank in enumerate(group):
        owned = owners.owned(rank, units)
        if owned:
            specs.append(ObjectSpec(f"g{j}of{n}{share}", owned, rank, (rank,)))
    return tuple(specs)


def header(space: str, name: str, length: int, crc: int) -> bytes:
    """What comes before an object's payload: magic, format version, the lengths of the
    namespace and the name, the payload's length and CRC-32, then the namespace and name."""
    ns, nm = space.encode(), name.encode()
    return HEADER.pack(MAGIC, FORMAT_VERSION, len(ns), len(nm), length, crc) + ns + nm


def largest_object(model: ModelGeometry) -> int:
    """At least the bytes of any object of `model`'s pages, header included (a namespace and
    a name take far less than the room left for them)."""
    return 4096 + sum(u.page_bytes for u in model.units)


def header_size(space: str, name: str) -> int:
    return HEADER.size + len(space.encode()) + len(name.encode())


def checksum(parts: Sequence[memoryview]) -> int:
    """CRC-32 of the parts' bytes, in order, as if they were one buffer."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return crc


def intact(head: bytes | bytearray, space: str, name: str, parts: Sequence[memoryview]) -> bool:
    """Whether `head` is exactly the header of object `name` of `space` whose payload `parts`
    hold: anything else (truncated, corrupted, someone else's) is a miss, never bytes."""
    length = sum(part.nbytes for part in parts)
    return bytes(head) == header(space, name, length, checksum(parts))
