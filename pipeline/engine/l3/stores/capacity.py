"""A file store's bound: what its folder holds, in a small ledger beside the objects that every
process sharing the folder updates under one lock, and the eviction that keeps the objects
under `storage.capacity_bytes`, least recently used first.

An object's last use is its access time, which the store sets itself when it writes or reads
one (the kernel's own atime is lazy or off on most mounts). The lock serializes the ledger's
updates and eviction passes across processes, never a read: a reader that opened an object
reads all of it even when an eviction unlinks it meanwhile (POSIX keeps an open file), and
one that comes later finds nothing, a miss. Only the store's own objects are counted and
removed (`owned`); every wait on the lock ends after `runtime.timeout_s`.

A tenant's quota (`storage.tenant_quota_bytes`): its writes evict only its own objects, which
are counted from its namespace folders under the lock (every process sees one count), where
the ledger says the folder would pass the quota.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from pipeline.core.l3_owned import tenant_of
from pipeline.engine.l3.stores.beneath import Beneath
from pipeline.engine.l3.stores.counters import Counters
from pipeline.engine.l3.stores.ledger import Ledger, open_ledger, read_ledger, write_ledger
from pipeline.engine.l3.stores.owned import (
    STALE_TEMPORARY_NS,
    Passed,
    Stored,
    unlink_unchanged,
    walk,
)

LOCK_POLL_S = 0.01
"""How often a wait on the folder's lock tries again."""

log = logging.getLogger("hicache-pipeline")


class CapacityFull(OSError):
    """A write that cannot fit under the capacity without evicting what it must keep."""


@dataclass(frozen=True)
class Quota:
    """The bytes a tenant's objects may take, and what evicting them leaves, at most."""

    tenant: str
    bytes: int
    target: int


@dataclass(frozen=True)
class Evicted:
    """What an eviction pass removed, and what the folder held after it."""

    objects: int
    bytes: int
    held_objects: int
    held_bytes: int
    left_alone: tuple[str, ...] = ()
    """What the pass's count left alone, and why (`owned.Passed.notes`)."""


class Bound:
    """The ledger of one store's folder, and eviction under its lock (between processes:
    flock on the ledger; between this process's threads: a lock of its own, since flock
    holds per open file, not per thread). A new one counts the folder again: the bound holds
    across restarts, whatever wrote the folder before."""

    def __init__(
        self,
        beneath: Beneath,
        counters: Counters,
        *,
        path: str,
        capacity: int,
        timeout_s: float,
        quota: Quota | None = None,
    ) -> None:
        self.beneath, self.counters, self.path = beneath, counters, path
        self.capacity, self.timeout_s, self.quota = capacity, timeout_s, quota
        self._threads = threading.Lock()
        self._refused: set[tuple[str, int]] = set()
        """Objects (name, inode) that could not be removed: warned about once, not counted."""
        self.fd = open_ledger(beneath, path, capacity)
        try:
            with self.locked():
                self._write(*self._count())
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        timeout = min(self.timeout_s, threading.TIMEOUT_MAX)
        deadline = time.monotonic() + timeout
        if not self._threads.acquire(timeout=timeout):
            raise self._held()
        try:
            while True:
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise self._held() from None
                    time.sleep(LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _held(self) -> TimeoutError:
        return TimeoutError(
            f"the file store's lock on {self.path}/.usage is held by another process for "
            f"{self.timeout_s:g} s; raise runtime.timeout_s or stop that process",
        )

    def held(self) -> tuple[int, int]:
        """(bytes, objects) the ledger says the folder holds."""
        found = read_ledger(self.fd)
        return (0, 0) if found is None else (found.bytes, found.objects)

    def _write(self, held_bytes: int, held_objects: int) -> None:
        write_ledger(self.fd, Ledger(held_bytes, held_objects, self.capacity))

    def _count(self) -> tuple[int, int]:
        found = [s for s in walk(self.beneath) if (s.name, s.inode) not in self._refused]
        return sum(s.size for s in found), len(found)

    @contextlib.contextmanager
    def admit(
        self, size: int, target: int, keep: Collection[str] = (), name: str = "", count: int = 1
    ) -> Iterator[None]:
        """For the block that renames `count` objects of `size` bytes in all (of `name`'s
        namespace) in: the ledger counts them (first, so a crash between the two counts too
        much, never too little), and where the folder would then pass the capacity, objects
        go, least recently used first and never those named in `keep`, until it holds at most
        `target` bytes with these; CapacityFull where `keep` alone leaves no room. Where
        `name` is the quota's tenant's, its own objects go first until the tenant is within
        its quota (`_within_quota`)."""
        with self.locked():
            held_bytes, held_objects = self.held()
            if self.quota and tenant_of(name.split("/")[0]) == self.quota.tenant:
                held = self._within_quota(self.quota, size, keep, held_bytes, held_objects)
                held_bytes, held_objects = held
            if held_bytes + size > self.capacity:
                done = self._evict(target - size, keep)
                held_bytes, held_objects = done.held_bytes, done.held_objects
                if held_bytes + size > self.capacity:
                    raise CapacityFull(
                        errno.ENOSPC,
                        f"storage.capacity_bytes={self.capacity}: the objects this write must "
                        f"keep (its own write-back's, {held_bytes} B held) leave no room for "
                        f"{size} B more; raise storage.capacity_bytes",
                    )
            self._write(held_bytes + size, held_objects + count)
            yield

    def _within_quota(
        self, quota: Quota, size: int, keep: Collection[str], held_bytes: int, held_objects: int
    ) -> tuple[int, int]:
        """Where the tenant's objects and `size` bytes more would pass its quota: its own
        least recently used objects (never those named in `keep`) go until it holds at most
        the quota's target with this one; what the folder holds then. CapacityFull where
        `keep` alone leaves no room."""
        if held_bytes + size <= quota.bytes:  # the whole folder fits: so does the tenant
            return held_bytes, held_objects
        mine = sum(s.size for s in walk(self.beneath, tenant=quota.tenant))
        if mine + size <= quota.bytes:
            return held_bytes, held_objects
        done = evict_pass(
            self.beneath,
            quota.target - size,
            self.counters,
            keep=keep,
            refused=self._refused,
            tenant=quota.tenant,
        )
        if done.held_bytes + size > quota.bytes:
            raise CapacityFull(
                errno.ENOSPC,
                f"storage.tenant_quota_bytes={quota.bytes}: tenant {quota.tenant}'s objects "
                f"this write must keep ({done.held_bytes} B) leave no room for {size} B more",
            )
        return max(held_bytes - done.bytes, 0), max(held_objects - done.objects, 0)

    def removed(self, size: int) -> None:
        """An object of `size` bytes is gone (a caller's remove)."""
        with self.locked():
            held_bytes, held_objects = self.held()
            self._write(max(held_bytes - size, 0), max(held_objects - 1, 0))

    def evict(self, to_bytes: int, keep: Collection[str] = ()) -> Evicted:
        """Remove objects, least recently used first (never those named in `keep`), until
        the folder holds at most `to_bytes` (what `store evict` runs)."""
        with self.locked():
            done = self._evict(to_bytes, keep)
            self._write(done.held_bytes, done.held_objects)
            return done

    def _evict(self, to_bytes: int, keep: Collection[str]) -> Evicted:
        return evict_pass(self.beneath, to_bytes, self.counters, keep=keep, refused=self._refused)

    def close(self) -> None:
        os.close(self.fd)


def evict_pass(
    beneath: Beneath,
    to_bytes: int,
    counters: Counters,
    *,
    keep: Collection[str] = (),
    refused: set[tuple[str, int]] | None = None,
    tenant: str | None = None,
) -> Evicted:
    """The folder counted again (other processes' writes, crashes, a replaced object: a
    ledger is exact after each pass), stale temporary files removed, then the least recently
    used objects not named in `keep` until it holds at most `to_bytes`. Of those that must
    go, the newest is removed first: one that cannot be removed is then left out of the
    count (and of later passes': `refused`, said once), and the older ones go only if still
    needed, so it is never a reason to remove all others. With `tenant`, only that tenant's
    namespaces are counted and evicted (what it holds is said, not the folder)."""
    refused = set() if refused is None else refused
    passed = Passed()
    found = [s for s in walk(beneath, passed, tenant) if (s.name, s.inode) not in refused]
    stale = time.time_ns() - STALE_TEMPORARY_NS
    for left in (t for t in passed.temporaries if t.used_ns < stale):
        unlink_unchanged(beneath, left)
    held_bytes, held_objects = sum(s.size for s in found), len(found)
    candidates = sorted((s for s in found if s.name not in keep), key=lambda s: s.used_ns)
    victims = 0  # the least recently used candidates[:victims] must go for all we know
    freed, gone = 0, []  # the bytes and names removed
    while held_bytes > to_bytes:
        victims = victims or _must_go(candidates, held_bytes - to_bytes)
        if not victims:
            break
        victims -= 1
        victim = candidates.pop(victims)
        outcome = unlink_unchanged(beneath, victim)
        if outcome == "kept":  # used since: no longer among the least recently used
            victims = 0
            continue
        if outcome == "refused":  # not counted: the others that must go are fewer
            refused.add((victim.name, victim.inode))
            log.warning(
                "the file store cannot remove %s (%d B): left alone, not counted",
                victim.name,
                victim.size,
            )
            victims = 0
        elif outcome == "removed":
            freed += victim.size
            gone.append(victim.name)
        held_bytes, held_objects = held_bytes - victim.size, held_objects - 1
    counters.evicted(gone, freed)
    return Evicted(len(gone), freed, held_objects, held_bytes, tuple(passed.notes))


def _must_go(candidates: list[Stored], excess: int) -> int:
    """How many of the least recently used `candidates` free at least `excess` bytes."""
    total = 0
    for count, stored in enumerate(candidates, 1):
        total += stored.size
        if total >= excess:
            return count
    return len(candidates)


def open_bound(
    beneath: Beneath,
    counters: Counters,
    path: str,
    capacity: int | None,
    timeout_s: float,
    quota: Quota | None = None,
) -> Bound | None:
    """The bound of the folder open at `beneath`, where it has a capacity; ValueError where the
    capacity is more than its disk can hold (its free space and what its objects take)."""
    if not capacity:
        return None
    disk = os.statvfs(beneath.fd)  # checked before a ledger is made or changed
    room = disk.f_bavail * disk.f_frsize + sum(s.size for s in walk(beneath))
    if capacity > room:
        raise ValueError(
            f"storage.capacity_bytes={capacity}: more than the folder {path} can hold "
            f"({room} B: its disk's free space and its objects); lower it, or free space"
        )
    return Bound(beneath, counters, path=path, capacity=capacity, timeout_s=timeout_s, quota=quota)
