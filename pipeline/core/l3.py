"""L3 objects: content addresses for token prefixes, one stored form per page whoever wrote it,
and a self-checking object format that a reader of a few units can check on its own.

A page's key is a hash chain over the token ids of every page up to it (as the prefix caches of
SGLang, vLLM and LMCache key theirs), inside a namespace that pins the model geometry, KV dtype
and page size: a key names a whole prefix, and two incompatible caches can never share one.

Each page is one object per replica group's share of the KV: every unit of the model in
ordinal order, whatever strategy or group size wrote it, so any strategy at any TP size reads
what any other wrote (MLA/DSA: every rank's share is the whole KV). The replica group's first
rank writes it; under rotating the other owners send it their layers first. A reader reads the
byte ranges of the units it loads (rotating: its own layers) and checks them alone: the header
carries a CRC-32C per unit and one over itself. Anything that does not match is a
miss, never bytes. The header also says each unit's length, so an object checks itself whole
without the model (`hicache-pipeline store verify`), and names itself, so the store removes
only what proves to be its own.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import crc32c
import numpy as np

from pipeline.core.model import ModelGeometry, Unit
from pipeline.core.ownership import OwnerMap
from pipeline.core.topology import Topology

FORMAT_VERSION = 3
"""3: the header says each unit's length and which key checks it (2: one object per page for
every strategy, a CRC-32C per unit; 1: one object per writer, CRC-32 over the payload; their
namespaces differ, so their objects are never found)."""
MAGIC = b"HCPL3"
HEADER = struct.Struct("<5sHHHBIQ16s")
"""magic, format version, namespace length, name length, check kind (`Checks.kind`), units,
payload length, and the check of the whole header (these fields with it zero, then the rest:
the namespace, the name, the key's id (`Checks.key_id`), and per unit its digest and its
length in bytes). Versions 2 and 3 share these fields and start the rest with the names."""
CHECK_AT = HEADER.size - 16
"""Where the header's check starts (the last of its fixed fields)."""
KEY_ID = 8
"""Bytes of the key's id in the header."""
UNIT_BYTES = struct.Struct("<I")
"""A unit's length, after its digest."""
MAX_UNITS = 1 << 16
"""The most units an object may have (a model has layers x pools: hundreds)."""
MAX_OBJECT_BYTES = 1 << 30
"""Larger than any object can be (deepseek_v3's page of 64 tokens: 2.6 MB): a file this
large is not an object, and nothing reads it."""


def namespace(model: ModelGeometry, revision: str = "", tenant: str = "") -> str:
    """The objects of one model geometry (name, KV dtype, page size, every unit's shape), of
    one weights `revision` and one `tenant` (`storage.model_revision`, `storage.tenant`:
    empty ones leave the name as it was before they existed, so stored objects stay found)."""
    units = [(u.ordinal, u.layer, u.pool, u.rows_per_page, u.row_bytes) for u in model.units]
    identity = repr((model.name, model.kv_dtype.value, model.page_size, units))
    identity += f"|revision={revision}" if revision else ""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    mine = f"-t{tenant}" if tenant else ""  # in the folder's name: a tenant's objects are its own
    return f"v{FORMAT_VERSION}-{model.kv_dtype.value}-p{model.page_size}-{digest}{mine}"


def prefix_keys(tokens: Sequence[int] | np.ndarray, slots_per_page: int, space: str) -> list[str]:
    """One key per page: SHA-256 over the previous page's key and this page's token ids, from
    the namespace on, so each key stands for the whole prefix that ends with its page."""
    try:
        ids = np.asarray(tokens)
    except (OverflowError, ValueError) as e:
        raise ValueError(f"tokens: integer token ids only ({e})") from e
    if ids.ndim != 1 or (len(ids) and (ids.dtype.kind not in "iu" or ids.dtype == np.uint64)):
        raise ValueError(
            f"tokens: a flat sequence of integer token ids (int64), got {ids.dtype} of shape "
            f"{ids.shape}: floats or strings would name other prefixes"
        )
    ids = ids.astype(np.int64)
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
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"keys repeat ({twice[:2]!r}): one key per page, each page once")


@dataclass(frozen=True)
class PageObject:
    """The object of every page for one replica group: all units in ordinal order."""

    share: str
    """'' where the replica group holds all of its attention group's KV, else which share
    (see `share_of`): different bytes of one prefix never share an object."""
    units: tuple[Unit, ...]
    """Every unit of the model, in ordinal order: the payload's order."""

    def name(self, space: str, key: str) -> str:
        return f"{space}/{key[:2]}/{key}{self.share}"  # `l3_keys.object_keys` reads it back

    @functools.cached_property
    def page_bytes(self) -> int:
        return sum(u.page_bytes for u in self.units)

    @functools.cached_property
    def offsets(self) -> dict[int, int]:
        """Per unit ordinal, where its bytes start in the payload."""
        found, first = {}, 0
        for unit in self.units:
            found[unit.ordinal] = first
            first += unit.page_bytes
        return found

    @functools.cached_property
    def unit_bytes(self) -> bytes:
        """Each unit's length, in order, as the header's table says them (4 bytes each)."""
        return np.array([u.page_bytes for u in self.units], dtype="<u4").tobytes()

    @functools.cached_property
    def index(self) -> dict[int, int]:
        """Per unit ordinal, its row in the header's digest table."""
        return {u.ordinal: i for i, u in enumerate(self.units)}

    def header_size(self, space: str, name: str, checks: Checks | None = None) -> int:
        row = (checks or Checks()).width + UNIT_BYTES.size
        return table_at(space, name) + row * len(self.units)


def table_at(space: str, name: str) -> int:
    """Where the digest table of object `name`'s header starts (past names and key id)."""
    return HEADER.size + len(space.encode()) + len(name.encode()) + KEY_ID


def share_of(topology: Topology, model: ModelGeometry, rank: int) -> str:
    """'' where `rank`'s replica group holds all of its attention group's KV (MLA without
    DCP); else which share it holds, '-s<i>of<n>' (a DCP shard, or an MHA rank's heads)."""
    shares = sorted({topology.replica_group(r, model) for r in topology.attn_group(rank)})
    if len(shares) == 1:
        return ""
    return f"-s{shares.index(topology.replica_group(rank, model))}of{len(shares)}"


@dataclass(frozen=True)
class PageRoles:
    """What one rank does with each page's object."""

    reads: tuple[Unit, ...]
    """The units it reads (and loads): every unit for a replicated reader and single_source's
    source, its own layers under rotating, none for a peer that receives broadcasts."""
    writer: int
    """The rank that writes the object: the replica group's first."""
    senders: tuple[int, ...]
    """The other ranks that hold some of its units (rotating): they send them to the writer."""


def page_roles(owners: OwnerMap, units: tuple[Unit, ...], rank: int) -> PageRoles:
    """Who reads and writes what of a page's object in one replica group (`owners`)."""
    senders = tuple(r for r in owners.group[1:] if 0 < len(owners.owned(r, units)) < len(units))
    return PageRoles(reads=owners.owned(rank, units), writer=owners.group[0], senders=senders)


@dataclass(frozen=True)
class Checks:
    """How an object's bytes are checked. Without a key: a CRC-32C per unit and over the
    header (accidents: a torn, truncated or flipped object). With a key (`storage.auth_key_
    file`): a keyed BLAKE2b-128 per unit and over the header, so whoever lacks the key cannot
    plant KV that a model would attend to."""

    key: bytes | None = None

    @property
    def kind(self) -> int:
        return 0 if self.key is None else 1

    @property
    def width(self) -> int:
        """Bytes of one digest in the header."""
        return 4 if self.key is None else 16

    @property
    def key_id(self) -> bytes:
        """Which key checks an object (zeros: none), so a reader with another key can tell
        "not my key" from "damaged": a keyed digest of a constant, which says nothing of the key."""
        if self.key is None:
            return bytes(KEY_ID)
        return hashlib.blake2b(
            b"hicache-pipeline key id", key=self.key, digest_size=KEY_ID
        ).digest()

    def unit(self) -> Callable[[memoryview | bytes], int]:
        """The digest of one unit's bytes. CRC-32C is the CPU's own instruction (zlib's
        CRC-32 was several times slower; see BENCHMARKS.md). It keeps Python's lock: a unit
        takes microseconds, and on 16 I/O threads each release and retake of the lock cost
        more than that (a run of units read as one buffer is checked outside it, `CrcRuns`).
        BLAKE2b leaves the lock, at about a tenth of the speed."""
        if self.key is None:
            return functools.partial(crc32c.crc32c, gil_release_mode=0)
        key = self.key
        return lambda view: int.from_bytes(
            hashlib.blake2b(view, key=key, digest_size=16).digest(), "little"
        )


digest = Checks().unit()
"""CRC-32C of a buffer (the unkeyed unit digest)."""


def header(
    space: str, name: str, digests: Sequence[int], unit_bytes: Sequence[int], checks: Checks
) -> bytes:
    """What comes before an object's payload: the fixed fields, the namespace, the name, the
    key's id, each unit's digest and length, with the check of all of it in the fixed fields."""
    ns, nm = space.encode(), name.encode()
    rows = b"".join(
        d.to_bytes(checks.width, "little") + UNIT_BYTES.pack(n)
        for d, n in zip(digests, unit_bytes, strict=True)
    )
    fields = (MAGIC, FORMAT_VERSION, len(ns), len(nm), checks.kind, len(digests), sum(unit_bytes))
    rest = ns + nm + checks.key_id + rows
    return HEADER.pack(*fields, header_check(fields, rest, checks)) + rest


def header_check(fields: Sequence[object], rest: bytes, checks: Checks) -> bytes:
    """The check of a header: its fixed `fields` with the check zero, then the `rest`."""
    return checks.unit()(HEADER.pack(*fields, bytes(16)) + rest).to_bytes(16, "little")


def unit_digests(
    head: bytes | bytearray | memoryview, obj: PageObject, space: str, name: str, checks: Checks
) -> list[int] | None:
    """The digest table of `head` if it is exactly a header of object `name` of `space` with
    `obj`'s units and lengths, checked as `checks` says, and its own check holds; None
    otherwise (a miss: another kind of check, with or without a key or another key, is one
    too)."""
    head = bytes(head)
    if len(head) != obj.header_size(space, name, checks):
        return None
    *fields, check = HEADER.unpack_from(head)
    ns, nm = space.encode(), name.encode()
    want = [MAGIC, FORMAT_VERSION, len(ns), len(nm), checks.kind, len(obj.units), obj.page_bytes]
    rest = head[HEADER.size :]
    if fields != want or not rest.startswith(ns + nm + checks.key_id):
        return None
    if header_check(fields, rest, checks) != check:
        return None
    table = rest[len(ns) + len(nm) + KEY_ID :]
    if checks.width == UNIT_BYTES.size:  # CRCs: the table as one array (a read's every page)
        rows = np.frombuffer(table, dtype="<u4").reshape(-1, 2)
        return rows[:, 0].tolist() if rows[:, 1].tobytes() == obj.unit_bytes else None
    found = unit_rows(table, checks.width)
    if [n for _, n in found] != [u.page_bytes for u in obj.units]:
        return None
    return [d for d, _ in found]


def unit_rows(table: bytes, width: int) -> list[tuple[int, int]]:
    """(digest, length) of each unit, from a header's table of digests `width` bytes wide."""
    row, length = width + UNIT_BYTES.size, UNIT_BYTES.unpack_from
    return [
        (int.from_bytes(table[i : i + width], "little"), length(table, i + width)[0])
        for i in range(0, len(table), row)
    ]


def largest_object(model: ModelGeometry) -> int:
    """At least the bytes of any object of `model`'s pages, header included (a namespace and
    a name take far less than the room left for them)."""
    return 4096 + 16 * len(model.units) + sum(u.page_bytes for u in model.units)


def object_bytes(model: ModelGeometry, tenant: str = "") -> int:
    """The most bytes one object of `model`'s pages takes (of `tenant`, whose name is in
    its namespace): its payload and its longest header (keyed digests, a share's name): what
    a write-back's worth of capacity counts."""
    obj = PageObject("-s999of999", model.units)
    space = namespace(model, tenant=tenant)
    return obj.header_size(space, obj.name(space, "0" * 32), Checks(b"widest")) + obj.page_bytes
