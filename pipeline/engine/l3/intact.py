"""What a write-back keeps at a page's name: only an object a load would read whole. The store
is asked first which names hold anything (one call: a bounded file store also keeps those from
eviction while the write-back runs); each one there is then read into scratch memory and
checked as a load checks it: the object's length, a header of this very name, namespace and
key, and every unit's digest. Anything else at the name (a flipped byte, a torn, truncated or
empty file, an object made without the key or with another, a FIFO or a link) is written over
as every write is: a new file renamed over the name (Mooncake: an upsert), never opened
through a link, never removed first.

A present object costs the write-back one read of it (from the page cache, typically) and
its digests, not a write: asking only whether a name holds a file let a damaged object stand
for good, a miss for its page and every page after it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from pipeline.core.l3 import Checks, PageObject, unit_digests
from pipeline.engine.l3.stores import ObjectStore
from pipeline.engine.l3.tier import L3Tier

Digests = Callable[[list[memoryview]], list[int]]
"""Each unit's digest, in order (CRC-32C, or the store's keyed MAC)."""


def stored_intact(
    store: ObjectStore, names: Sequence[str], intact: Callable[[str], bool], threads: Executor
) -> list[bool]:
    """Whether each of `names` (distinct) holds an intact object: the store asked once which
    hold anything, then each of those checked by `intact` on `threads`."""
    there = store.exists(list(names))
    present = [name for name, found in zip(names, there, strict=True) if found]
    checked = dict(zip(present, threads.map(intact, present), strict=True))
    return [checked.get(name, False) for name in names]


def read_intact(
    store: ObjectStore,
    obj: PageObject,
    space: str,
    checks: Checks,
    name: str,
    scratch: tuple[memoryview, list[memoryview]],
    digests: Digests,
) -> bool:
    """Whether `name` holds exactly an object of `obj`'s length whose header is this name's,
    namespace's and key's and whose every unit matches its digest: read whole into `scratch`
    (a header's buffer, then each unit's, laid out as the object), not counted as a hit."""
    head, units = scratch

    def check(_: int) -> bool:
        table = unit_digests(head, obj, space, name, checks)
        return table is not None and digests(units) == table

    return store.read_once(name, head.nbytes + obj.page_bytes, [(0, [head, *units])], check)


def intact_pages(tier: L3Tier, keys: Sequence[str]) -> list[bool]:
    """Whether each key's page already has an intact object in the tier's store (what its
    write-back leaves alone), checked on the tier's I/O threads."""
    names = [tier.name(key) for key in keys]
    return stored_intact(tier.store, names, functools.partial(_tier_intact, tier), tier.io)


def _tier_intact(tier: L3Tier, name: str) -> bool:
    obj = tier.object
    with tier.scratches.taken() as scratch:
        head = memoryview(scratch.head)[: obj.header_size(tier.space, name, tier.checks)]
        whole = (head, scratch.views(obj.units))
        return read_intact(tier.store, obj, tier.space, tier.checks, name, whole, tier.digests)
