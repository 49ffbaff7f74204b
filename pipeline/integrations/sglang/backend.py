"""SGLang's one plug point for an L3 store, `HiCacheStorage`, backed by this project's stores.

SGLang builds it through its dynamic factory (`--hicache-storage-backend dynamic` with
`module_path` and `class_name` in the extra config, docs/sglang.md), calls
`register_mem_pool_host` with its host KV pool, then moves pages of that pool by host slot:
`batch_set_v1` / `batch_get_v1` (zero-copy: `interface_v1`) and `batch_exists`. Each page is
one object of this project's format in the file store (bounded, jailed below its folder) or
Mooncake, keyed from SGLang's own page hashes (`block_keys`), so a page SGLang writes is an
object the project's engine, `store verify` and `store evict` know.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

from pipeline.core.l3 import Checks, check_keys, largest_object, namespace
from pipeline.core.l3_keys import block_keys
from pipeline.engine.l3.groups import cut_store
from pipeline.engine.l3.intact import stored_intact
from pipeline.engine.l3.stores import open_store
from pipeline.engine.l3.stores.keys import read_key_file
from pipeline.integrations.sglang.host_pages import HostPages
from pipeline.integrations.sglang.objects import PageIO
from pipeline.integrations.sglang.requests import (
    Throughput,
    host_pages,
    model_name,
    page_hashes,
    share,
    unsupported,
)
from pipeline.integrations.sglang.settings import settings

log = logging.getLogger("hicache-pipeline")

V1_ONLY = "this backend moves pages only through batch_get_v1/batch_set_v1 (interface_v1)"


class PipelineStorage(HiCacheStorage):
    """A `HiCacheStorage` whose pages are this project's L3 objects, in its file store or
    Mooncake; built by SGLang's `StorageBackendFactory` from the extra config."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        # SGLang's dynamic factory passes its own keyword arguments as one dict (`kwargs`):
        # none of them concern this backend
        problem = unsupported(storage_config)
        if problem is not None:
            raise NotImplementedError(problem)
        self.config = storage_config
        self.settings = settings(storage_config.extra_config)
        key_file = self.settings.storage.auth_key_file
        self.checks = Checks(read_key_file(key_file) if key_file else None)
        self.io: PageIO | None = None
        self.threads = ThreadPoolExecutor(
            self.settings.storage.io_threads, thread_name_prefix="hicache-sglang"
        )
        self.throughput = Throughput()

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Open the store for the objects of this host pool's pages (its layout, dtype and
        geometry name their namespace)."""
        super().register_mem_pool_host(mem_pool_host)
        self._close_io()  # SGLang attaches again after a detach: a new pool, a new store
        name = self.settings.model or model_name(self.config)
        pages = HostPages(mem_pool_host, name=name)
        storage = self.settings.storage
        space = namespace(pages.model, storage.model_revision, storage.tenant)
        if storage.path is not None:  # as SGLang's own file backend, make the folder
            os.makedirs(storage.path, mode=0o700, exist_ok=True)
        store = open_store(storage, largest_object(pages.model), timeout_s=self.settings.timeout_s)
        try:
            self.io = PageIO(
                store,
                pages,
                space=space,
                share=share(self.config, mla=pages.mla),
                checks=self.checks,
                num_threads=storage.io_threads,
            )
            cut_store(store, space, self.io.object, storage.stream_layers)  # as the engine's
        except BaseException:  # Mooncake refused to register the pool
            store.close()
            raise

    def _io(self) -> PageIO:
        if self.io is None:
            raise RuntimeError("no host pool: SGLang calls register_mem_pool_host first")
        return self.io

    def _requests(self, keys: list[str], host_indices: torch.Tensor) -> list[tuple[str, int]]:
        """(page key, host page) per key, every argument checked before a byte moves."""
        io = self._io()
        pages = host_pages(host_indices, len(keys), io.pages.page_size, io.pages.num_pages)
        return list(zip(self._keys(keys), pages, strict=True))

    def _keys(self, keys: list[str]) -> list[str]:
        if not isinstance(keys, list | tuple):
            raise ValueError(f"keys: a list of SGLang's page hashes, got {type(keys).__name__}")
        found: list[str] = list(block_keys(page_hashes(keys), self._io().space))
        check_keys(found, len(found))
        return found

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Store each key's host page as its object, straight from the pool where the
        layout allows; True where it is stored (or already was, intact: anything else at its
        name, damaged or not made with this key, is written over)."""
        io, requests = self._io(), self._requests(keys, host_indices)
        start = time.perf_counter()
        # asking first skips what is stored intact, and tells a bounded file store which
        # objects this write-back holds (its eviction keeps them)
        names = [io.name(key) for key, _ in requests]
        there = stored_intact(io.store, names, io.intact, self.threads)
        todo = [request for request, stored in zip(requests, there, strict=True) if not stored]
        if io.writes_many:  # one store call, as the engine's write-backs
            written = self._write_many(todo)
            done = [stored or written for stored in there]
        else:
            writes = iter([self.threads.submit(self._write, key, page) for key, page in todo])
            done = [stored or next(writes).result() for stored in there]
        self.throughput.add("backup", len(todo), io.size, time.perf_counter() - start)
        return done

    def _write_many(self, requests: list[tuple[str, int]]) -> bool:
        keys, pages = [key for key, _ in requests], [page for _, page in requests]
        try:
            self._io().write_many(keys, pages, self.settings.storage.io_threads)
        except Exception as e:  # which page failed is not said: SGLang retries them all later
            log.warning("L3 write of %d pages failed: %s", len(requests), e)
            return False
        return True

    def _write(self, key: str, page: int) -> bool:
        try:
            self._io().write(key, page)
        except Exception as e:  # a full store, a master gone: SGLang retries the page later
            log.warning("L3 write of page %s failed: %s", key, e)
            return False
        return True

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Fill each key's host page from its object, checked unit by unit; False for a
        page whose object is absent, truncated, corrupt or not this key's (a miss, never
        bytes SGLang would use). Where the pages go in one store call (`PageIO.reads_many`)
        the reads stop at the first miss and every page after it is False too: SGLang
        takes a prefetch's pages up to the first False."""
        io, requests = self._io(), self._requests(keys, host_indices)
        start = time.perf_counter()
        if io.reads_many:  # one store call, as the engine's loads: up to the first miss
            pages = [page for _, page in requests]
            read = io.read_many(
                [key for key, _ in requests], pages, self.settings.storage.io_threads
            )
            found = [i < read for i in range(len(requests))]
        else:
            reads = [self.threads.submit(io.read, key, page) for key, page in requests]
            found = [read.result() for read in reads]
        self.throughput.add("prefetch", sum(found), io.size, time.perf_counter() - start)
        return found

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many pages at the front of `keys` have objects in the store."""
        io = self._io()
        present = io.store.exists([io.name(key) for key in self._keys(keys)])
        return present.index(False) if False in present else len(present)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        raise NotImplementedError(V1_ONLY)

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> Any:
        raise NotImplementedError(V1_ONLY)

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        raise NotImplementedError(V1_ONLY)

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        raise NotImplementedError(V1_ONLY)

    def clear(self) -> None:
        """Removes nothing: the store is shared (other instances, the project's engines);
        `hicache-pipeline store evict` empties a file store's folder, a Mooncake master
        its own."""
        log.warning("clear: the L3 store is shared, so SGLang's clear removes nothing")

    def get_stats(self) -> Any:
        """SGLang's storage metrics (pages and GB/s of each call since the last ask) where
        `--enable-cache-report` asked for them; None otherwise."""
        if not self.config.enable_storage_metrics:
            return None
        return self.throughput.metrics()

    def counts(self) -> dict[str, int | None]:
        """The store's counts (hits, misses, writes, evictions...) and the objects this
        backend found corrupt or forged: this project's L3 counters."""
        io = self._io()
        found = dict(io.store.stats())
        found.update(
            {f"{what}_objects": io.counts[f"{what}_objects"] for what in ("corrupt", "forged")}
        )
        return found

    def close(self) -> None:
        self.threads.shutdown()
        self._close_io()

    def _close_io(self) -> None:
        if self.io is not None:
            io, self.io = self.io, None
            io.close()
            io.store.close()
