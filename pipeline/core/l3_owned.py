"""What proves that a file is an object of the L3 format (`pipeline.core.l3`): where it lies
(a namespace folder, a key-prefix folder, a key) and a header that names it. The file store
removes nothing else, whoever asks (eviction, `store evict`, `store verify --remove`).
"""

from __future__ import annotations

import re
import struct

from pipeline.core.l3 import HEADER, MAGIC
from pipeline.core.storage import MAX_NAME_CHARS

NAMESPACE = re.compile(rf"v\d+-\w+-p\d+-[0-9a-f]{{16}}(-t[A-Za-z0-9._-]{{1,{MAX_NAME_CHARS}}})?")
"""A namespace's name (`namespace`), of any format version, a tenant's or not."""
PREFIX = re.compile(r"[0-9a-f]{2}")
"""The folder of the objects whose keys start with it (`PageObject.name`)."""
LEAF = re.compile(r"([0-9a-f]{32})(-s\d+of\d+)?")
"""An object's own name: its key and, for a share, which (`PageObject.name`)."""


def tenant_of(space: str) -> str | None:
    """The tenant whose namespace folder `space` is ('' for no tenant's); None where `space`
    is no namespace's name."""
    found = NAMESPACE.fullmatch(space)
    if found is None:
        return None
    return found.group(1)[2:] if found.group(1) else ""


def is_object_name(name: str) -> bool:
    """Whether `name` is where `PageObject.name` puts an object: namespace/prefix/key[share]."""
    parts = name.split("/")
    if len(parts) != 3 or not NAMESPACE.fullmatch(parts[0]) or not PREFIX.fullmatch(parts[1]):
        return False
    leaf = LEAF.fullmatch(parts[2])
    return leaf is not None and leaf.group(1).startswith(parts[1])


def names_itself(head: bytes, name: str) -> bool:
    """Whether `head`, an object's first `name_bytes(name)` bytes, starts a header of this
    format (any version from 2) that names `name`: proof that the store wrote it."""
    space = name.split("/")[0].encode()
    if len(head) < name_bytes(name) or head[:5] != MAGIC:
        return False
    _, version, ns_len, name_len = struct.unpack_from("<5sHHH", head)
    if version < 2 or (ns_len, name_len) != (len(space), len(name.encode())):
        return False
    return head[HEADER.size : name_bytes(name)] == space + name.encode()


def name_bytes(name: str) -> int:
    """Bytes of an object's header up to the end of its names."""
    return HEADER.size + len(name.split("/")[0].encode()) + len(name.encode())
