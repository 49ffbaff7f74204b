"""The L3 store behind the host tier: which one, and where.

`StorageConfig` is the typed schema of the `storage` config group: the one home of every store
setting (the topology no longer names a storage backend).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from pipeline.core.checks import Problem, at_least, finite, raise_problems
from pipeline.core.sizing import parse_bytes

MAX_IO_THREADS = 64
MAX_NAME_CHARS = 64
"""The longest storage.model_revision or storage.tenant (a SHA-256 in hex fits)."""
NAME = re.compile(rf"[A-Za-z0-9._-]{{0,{MAX_NAME_CHARS}}}")
"""What storage.model_revision and storage.tenant may hold: they go into object names."""
P2P_METADATA = "P2PHANDSHAKE"
"""Mooncake's metadata without a server: the clients exchange it directly."""
METADATA_URL = re.compile(r"https?://[\w.-]+:\d+(/[\w./-]*)?|" + P2P_METADATA)
"""A metadata server's URL (scheme, host, port, path; no user or password), or P2PHANDSHAKE."""


def minimum_capacity(object_bytes: int, objects: int, evict_to: float) -> int:
    """The least storage.capacity_bytes that holds one write-back of `objects` objects of up
    to `object_bytes` each under `evict_to` of it."""
    return math.ceil(objects * object_bytes / evict_to)


def shown_url(url: str) -> str:
    """`url` as it may be printed: any user and password replaced."""
    return re.sub(r"//[^/@]*@", "//***@", url)


class PrefetchPolicy(Enum):
    """How a prefetched load from L3 agrees on its pages: wait_complete (wait for every read),
    best_effort (take what every reader has ready now), timeout (wait up to
    storage.prefetch_timeout_s, then take what is ready)."""

    wait_complete = "wait_complete"
    best_effort = "best_effort"
    timeout = "timeout"


class WriteAdmission(Enum):
    """Which pages a write-back stores: always (every one), after_hits (a page named by
    storage.admit_after_hits lookups or prefetches, this one included)."""

    always = "always"
    after_hits = "after_hits"


class StorageKind(Enum):
    """none: no L3; file: objects in a folder on local disk; mooncake: Mooncake Store."""

    none = "none"
    file = "file"
    mooncake = "mooncake"


@dataclass(kw_only=True)
class StorageConfig:
    """The L3 store: its kind and how to reach it."""

    kind: StorageKind = StorageKind.none
    """none, file (a folder on this machine's disk) or mooncake (Mooncake Store)."""
    path: str | None = None
    """file (any other store refuses it): the folder of the objects; null makes a temporary
    one for the job and removes it at the end."""
    master: str = "auto"
    """mooncake: the master's host:port, or auto (the job starts one on loopback and stops
    it at the end)."""
    metadata_server: str | None = None
    """mooncake with a given master: the HTTP metadata server's URL, or P2PHANDSHAKE (the
    clients exchange it directly; what master=auto uses)."""
    segment_bytes: int = 256 << 20
    """mooncake: the memory each rank lends the store (objects live in the ranks' segments)."""
    io_threads: int = 4
    """Objects each rank reads or writes at once (a store's reads and digests run outside
    Python's lock, so a few threads keep a disk or a network link busy)."""
    auth_key_file: str | None = None
    """A file holding a secret key (16-64 bytes): objects then carry a keyed BLAKE2b-128 MAC
    per unit and over their header, and an object without a valid one is a miss; null: a
    CRC-32C (accidents only). Every writer and reader of a store needs the same key."""
    direct_io: bool = False
    """file: read objects bypassing the OS page cache (O_DIRECT, whole objects into aligned
    buffers): faster for a store that is not cached, slower for one that is (BENCHMARKS.md)."""
    load_chunk_pages: int | None = None
    """Pages of a load from L3 agreed on and loaded to the device at a time, while the next
    are read (0: read every page, then load them all). null: 64 on cuda, where the copy is
    the GPU's DMA; 0 on CPU ranks, where the copy is CPU work that slows the reads beside it
    (see BENCHMARKS.md)."""
    stream_layers: int | None = None
    """Layers per read of a load from L3 that the forward consumes as they land (0: off):
    every page's first layer (a group of its own: the forward's first layer waits for no
    more) is read and agreed on, the load returns, and each later group is read in the
    background and copied to the device as the forward asks for its layers (`LoadHandle.wait`),
    so the forward starts before the prefix is read. null: an eighth of the layers a group
    where it pays (a GPU rank, the store reading a group natively, as fast as whole objects:
    the file store, not Mooncake; CRC checks, at least 16 MiB a group: BENCHMARKS.md), else
    off. Not for loads with exchanges (single_source, rotating) or a cross-rank verify; with
    direct_io every group reads its whole object. An explicit N keeps Mooncake's objects as a
    piece a group, read whole (every writer and reader must set the same N: docs/l3.md)."""
    capacity_bytes: str | None = None
    """file: the most bytes the folder's objects may take (an int or a size such as 64GiB;
    KiB, MiB...: powers of 1024; KB, MB...: of 1000), shared by every process that writes
    it; a write that would pass it first removes the least recently used objects (a read
    is a use). null: unbounded. mooncake: refused (the master evicts on its own)."""
    evict_to: float = 0.9
    """file with capacity_bytes: an eviction removes objects until they take at most this
    fraction of capacity_bytes (0 < evict_to <= 1), so not every write evicts."""
    prefetch_policy: PrefetchPolicy = PrefetchPolicy.best_effort
    """How `engine.load_prefetched` agrees on the pages an `engine.prefetch` read (every rank
    of the replica group takes the same leading pages): wait_complete (wait for every read),
    best_effort (take what every reader has ready now) or timeout (wait up to
    prefetch_timeout_s, then take what is ready)."""
    prefetch_timeout_s: float = 1.0
    """prefetch_policy=timeout: the longest a prefetched load waits for its reads."""
    min_hit_pages: int = 1
    """A lookup or prefetched load that finds fewer leading pages reports 0 (loads none):
    below it a hit is not worth a load."""
    model_revision: str = ""
    """Which weights wrote the KV (e.g. a checkpoint's hash): another revision's objects are
    never found, since another checkpoint's KV differs for the same tokens. Letters, digits,
    '.', '_', '-'; at most 64. Empty: one revision."""
    tenant: str = ""
    """Whose objects these are: another tenant's prefixes are never found (a lookup is a
    miss), so no tenant learns which prompts another sent. Letters, digits, '.', '_', '-';
    at most 64. Empty: no tenant."""
    tenant_quota_bytes: int = 0
    """file with capacity_bytes and a tenant: the most bytes this tenant's objects may take
    in the folder (at most capacity_bytes); a write that would pass it first removes the
    tenant's own least recently used objects, down to evict_to of it, never another's.
    0: no quota."""

    write_admission: WriteAdmission = WriteAdmission.always
    """always: a write-back stores every page it names; after_hits: only pages that lookups
    or prefetches named at least admit_after_hits times (a one-off prompt's prefix never
    fills the store). Every rank of a replica group counts the same collective calls, so
    all decide alike."""
    admit_after_hits: int = 2
    """write_admission=after_hits: the lookups or prefetches that name a page before a
    write-back stores it (SGLang's write_through_selective takes 2)."""
    admit_tracked_pages: int = 100_000
    """write_admission=after_hits: the pages whose counts are kept (about 200 B each); the
    least recently named is forgotten first, and counts from 0 when named again."""
    write_back_queue_pages: int = 0
    """Host pages a rank's write-backs may hold unreleased (until a poll releases them): one
    that finds as many ahead of it is dropped whole, its pages kept in the host tier only
    (hicache_l3_write_dropped_pages_total counts them). 0: no bound."""

    def __post_init__(self) -> None:
        found = at_least(
            "storage",
            self,
            segment_bytes=1 << 20,
            io_threads=1,
            load_chunk_pages=0,
            stream_layers=0,
            min_hit_pages=1,
            admit_after_hits=1,
            admit_tracked_pages=1,
            write_back_queue_pages=0,
        )
        found += finite("storage", self, "evict_to") + self._capacity_problems() + self._names()
        timeout = self.prefetch_timeout_s
        if isinstance(timeout, int | float) and (not math.isfinite(timeout) or timeout <= 0):
            message = f"storage.prefetch_timeout_s={timeout}: seconds, > 0"
            found.append(Problem("storage.prefetch_timeout_s", message))
        if self.io_threads > MAX_IO_THREADS:
            message = f"storage.io_threads={self.io_threads}: at most {MAX_IO_THREADS}"
            found.append(Problem("storage.io_threads", message))
        raise_problems(found + self._where_problems())

    def _where_problems(self) -> list[Problem]:
        """The folder, master and metadata server: where the store is."""
        found = []
        if self.path is not None and not self.path.strip():
            message = "storage.path='': name a folder, or null for a temporary one"
            found.append(Problem("storage.path", message))
        elif self.path is not None and self.kind is not StorageKind.file:  # it would be unused
            message = (
                f"storage.path={self.path!r}: only storage=file keeps its objects in a folder "
                f"(this config has storage={self.kind.value}): add storage=file, or drop "
                "storage.path"
            )
            found.append(Problem("storage.path", message))
        if self.master != "auto" and not re.fullmatch(r"[\w.-]+:\d+", self.master):
            message = f"storage.master={self.master!r}: host:port, or auto"
            found.append(Problem("storage.master", message))
        key = "storage.metadata_server"
        if self.metadata_server is not None and not METADATA_URL.fullmatch(self.metadata_server):
            message = (
                f"{key}={shown_url(self.metadata_server)!r}: http://host:port/path, without "
                "credentials in it (a URL is printed and logged)"
            )
            found.append(Problem(key, message))
        if self.master != "auto" and self.metadata_server is None:
            message = (
                f"{key}: the metadata server's URL is needed with a given storage.master (e.g. "
                "http://host:8080/metadata)"
            )
            found.append(Problem(key, message))
        return found

    def _names(self) -> list[Problem]:
        found = []
        for key, value in (("model_revision", self.model_revision), ("tenant", self.tenant)):
            if not isinstance(value, str) or not NAME.fullmatch(value):
                message = (
                    f"storage.{key}={value!r}: letters, digits, '.', '_' and '-' only, at most "
                    f"{MAX_NAME_CHARS} (it goes into the store's object names)"
                )
                found.append(Problem(f"storage.{key}", message))
        return found

    def _capacity_problems(self) -> list[Problem]:
        found = self._quota_problems()
        evict_to = self.evict_to
        if isinstance(evict_to, int | float) and math.isfinite(evict_to) and not 0 < evict_to <= 1:
            message = f"storage.evict_to={self.evict_to}: a fraction of capacity_bytes in (0, 1]"
            found.append(Problem("storage.evict_to", message))
        if self.capacity_bytes is None:
            return found
        key = "storage.capacity_bytes"
        try:
            parse_bytes(str(self.capacity_bytes))
        except ValueError:
            message = (
                f"{key}={self.capacity_bytes!r} must be a whole number of bytes from 1 to "
                "1e15, e.g. 64GiB, 512MiB or 68719476736 (null: unbounded)"
            )
            return [*found, Problem(key, message)]
        if self.kind is StorageKind.mooncake:
            message = (
                f"{key}: storage=mooncake holds what the ranks lend it (storage.segment_bytes "
                "each) and its master evicts on its own (mooncake_master "
                "--eviction_high_watermark_ratio); leave it null"
            )
            found.append(Problem(key, message))
        return found

    def _quota_problems(self) -> list[Problem]:
        quota, key = self.tenant_quota_bytes, "storage.tenant_quota_bytes"
        if not isinstance(quota, int) or quota <= 0:  # 0: no quota
            return at_least("storage", self, tenant_quota_bytes=0)
        if not self.tenant:
            return [Problem(key, f"{key}={quota}: a tenant's bound; set storage.tenant too")]
        try:
            capacity = self.capacity
        except ValueError:  # capacity_bytes' own problem
            return []
        if capacity is None:
            message = f"{key}={quota}: a tenant's share of a bounded store; set capacity_bytes"
            return [Problem(key, message)]
        if quota > capacity:
            message = f"{key}={quota}: more than storage.capacity_bytes={capacity} B"
            return [Problem(key, message)]
        return []

    def quota_problem(self, object_bytes: int, objects: int, tokens: int = 0) -> str | None:
        """Why tenant_quota_bytes is too small for a write-back (as `capacity_problem`)."""
        quota = self.tenant_quota_bytes
        if not 0 < quota < minimum_capacity(object_bytes, objects, self.evict_to):
            return None
        return self._fit(f"tenant_quota_bytes={quota}", object_bytes, objects, tokens)

    def capacity_problem(self, object_bytes: int, objects: int, tokens: int = 0) -> str | None:
        """Why capacity_bytes is too small for a write-back of `objects` objects of up to
        `object_bytes` each (None where it is not): they must all fit under evict_to of it
        (what an eviction leaves), or a write-back could not keep its own prefix's head.
        `tokens`: the workload.num_tokens that sizes the write-back (0: none does)."""
        capacity = self.capacity
        if capacity is None or capacity >= minimum_capacity(object_bytes, objects, self.evict_to):
            return None
        return self._fit(f"capacity_bytes={self.capacity_bytes}", object_bytes, objects, tokens)

    def _fit(self, setting: str, object_bytes: int, objects: int, tokens: int) -> str:
        """The message of a bound (`setting`) too small for one write-back."""
        least = minimum_capacity(object_bytes, objects, self.evict_to)
        sized = f" (workload.num_tokens={tokens})" if tokens else ""
        lower = "lower workload.num_tokens, or " if tokens else ""
        return (
            f"storage.{setting}: one write-back of {objects} objects{sized} of up to "
            f"{object_bytes} B must fit under storage.evict_to={self.evict_to} of it; "
            f"{lower}raise it to at least {least} B"
        )

    @property
    def capacity(self) -> int | None:
        """capacity_bytes in bytes (None: unbounded)."""
        return None if self.capacity_bytes is None else parse_bytes(str(self.capacity_bytes))

    @property
    def attached(self) -> bool:
        return self.kind is not StorageKind.none
