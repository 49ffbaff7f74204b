"""Rank functions for the L3 tests: a write-back and a load from L3 with the store damaged (or
one rank's plan changed) in between, reporting what came back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.cli import main
from pipeline.config.job import Job
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.engine.l3.handles import L3Load
from pipeline.engine.l3.stores import FileStore
from pipeline.jobs.contents import (
    POISON,
    fill_random,
    first_mismatch,
    poison,
    poison_host,
    snapshot,
)
from pipeline.jobs.run import forward

PAGES = 4


def damage(engine: Engine, keys: list[str], case: str) -> None:
    """Spoil the store as `case` says (rank 0 does it; the others wait): 'missing' page 2,
    'truncated' page 1, 'corrupted' page 2 (one bit of its last unit), 'corrupted_first'
    page 1 (one bit of its first unit, read in the same call as the header), 'header' page 1
    (one bit of the header's digest table), 'foreign' page 0 (holds page 3's intact object);
    anything else leaves it alone. Under rotating each corrupted unit has one reader: the
    other rank's read is intact, and the group still agrees on the miss."""
    tier = engine.l3
    assert tier is not None
    if engine.runtime.rank == 0:
        names = [tier.name(k) for k in keys]
        store = tier.store
        if case == "missing":
            assert isinstance(store, FileStore)
            Path(store.root, names[2]).unlink()
        if case == "truncated":
            blob = store.get(names[1])
            assert blob is not None
            store.put(names[1], [blob[: len(blob) // 2]])
        if case == "corrupted":
            blob = bytearray(store.get(names[2]) or b"")
            blob[-1] ^= 0x01
            store.put(names[2], [blob])
        if case in ("corrupted_first", "header"):
            obj = tier.object
            blob = bytearray(store.get(names[1]) or b"")
            first = obj.header_size(tier.space, names[1])
            blob[first + (3 if case == "corrupted_first" else -1)] ^= 0x40
            store.put(names[1], [blob])
        if case == "foreign":
            blob = store.get(names[3])
            assert blob is not None
            store.put(names[0], [blob])
    dist.barrier()


def loaded_from_l3(engine: Engine, keys: list[str], target: list[int]) -> tuple[L3Load, list[int]]:
    """Load `keys` from L3 into fresh host pages and the `target` device pages, a forward
    waiting per layer, until the ack: (what it loaded, the host pages it took)."""
    size = engine.sizing.slots_per_page
    fresh = engine.host_allocator.alloc(len(target))
    loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens(target, size))
    if loaded.handle is not None:
        forward(engine, loaded.handle)
        loaded.handle.done(engine.runtime.forward_stream).wait()
    return loaded, fresh


def through_l3(args: tuple[Job, str], rank: int, world_size: int, local_rank: int) -> dict:
    """Fill and back up 4 pages, write them back, evict them from the host tier, damage the
    store (`case`), then look up and load from L3 into poisoned device pages.

    'plan_differs': rank 1 loads into other device pages than its peers (its plan's SHA-256
    differs), so a deduplicated load must fall back to per-rank reads."""
    job, case = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        return _through_l3(engine, case)
    finally:
        engine.close()


def _through_l3(engine: Engine, case: str) -> dict[str, Any]:
    size, rank = engine.sizing.slots_per_page, engine.runtime.rank
    source = list(range(PAGES))
    fill_random(engine, source, 11 + engine.runtime.replica_group[0])
    expected = snapshot(engine, source)
    host = engine.host_allocator.alloc(PAGES)
    engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
    keys = engine.l3_keys(list(range(500, 500 + PAGES * size)))
    engine.write_back(keys, page_tokens(host, size)).wait()
    while engine.acks.pending:  # every rank's objects are stored once all are released
        engine.poll()
    poison_host(engine, host)
    engine.host_allocator.free(host)
    damage(engine, keys, case)
    shift = 16 if case == "plan_differs" and rank == 1 else 8
    target = [p + shift for p in source]
    poison(engine, target)
    found = engine.lookup(keys)
    tier, rounds = engine.l3, [0]
    assert tier is not None
    agree_while = tier.agree_while

    def counted(value: Any, going: bool) -> tuple[list[Any], bool]:
        rounds[0] += 1
        return agree_while(value, going)

    tier.agree_while = counted  # type: ignore[method-assign]
    try:
        loaded, _ = loaded_from_l3(engine, keys, target)
    finally:
        del tier.agree_while
    hits = loaded.hits
    rest = snapshot(engine, target[hits:]) if hits < PAGES else {}
    while engine.acks.pending:
        engine.poll()
    return {
        "found": found,
        "hits": hits,
        "fallback": loaded.fallback,
        "loaded": first_mismatch(engine, target[:hits], {u: e[:hits] for u, e in expected.items()})
        if hits
        else "",
        "rest_untouched": all(bool((t == POISON).all()) for t in rest.values()),
        "device_tier_kept": first_mismatch(engine, source, expected),
        "l3_read_bytes": engine.trace.bytes.get(("l3_read", ""), 0),
        "fallback_ops": engine.trace.counts.get("l3_fallback", 0),
        "windows": len(loaded.handle.loads) if loaded.handle is not None else 0,
        "rounds": rounds[0],  # the load's agreements with the replica group
    }


def held_pages_refused(job: Job, rank: int, world_size: int, local_rank: int) -> list[str]:
    """What the engine says to L3 calls that would lose data or name bad pages."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        size = engine.sizing.slots_per_page
        host, empty = engine.host_allocator.alloc(2), engine.host_allocator.alloc(2)
        fill_random(engine, [0, 1], 3)
        engine.backup(page_tokens(host, size), page_tokens([0, 1], size)).wait()
        before = [engine.host_pool.layer(u).clone() for u in engine.host_pool.owned]
        keys = engine.l3_keys(list(range(2 * size)))
        errors = []
        for call in (
            lambda: engine.load_from_l3(keys, page_tokens(host, size), page_tokens([4, 5], size)),
            lambda: engine.write_back(keys, page_tokens(empty, size)),
            lambda: engine.write_back(["../../x"] * 2, page_tokens(host, size)),
            lambda: engine.lookup([*keys[:1], "zz"]),
        ):
            try:
                call()
                errors.append("")
            except ValueError as e:
                errors.append(str(e))
        after = [engine.host_pool.layer(u) for u in engine.host_pool.owned]
        if not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)):
            errors.append("host pool changed")
        return errors
    finally:
        engine.close()


def master_gone(args: tuple[Job, int], rank: int, world_size: int, local_rank: int) -> dict:
    """Write 2 pages back, then rank 0 kills the Mooncake master (its RPC port given): a
    lookup and a load find nothing, a write-back fails on its writer with a clear error, and
    the device and host tiers keep their pages."""
    job, rpc_port = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        size = engine.sizing.slots_per_page
        fill_random(engine, [0, 1], 5)
        expected = snapshot(engine, [0, 1])
        host = engine.host_allocator.alloc(2)
        engine.backup(page_tokens(host, size), page_tokens([0, 1], size)).wait()
        keys = engine.l3_keys(list(range(2 * size)))
        engine.write_back(keys, page_tokens(host, size)).wait()
        while engine.acks.pending:
            engine.poll()
        if rank == 0:
            subprocess.run(["pkill", "-9", "-f", f"rpc_port={rpc_port}"], check=True)
        dist.barrier()
        found = engine.lookup(keys)
        fresh = engine.host_allocator.alloc(2)
        loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens([4, 5], size))
        try:
            more = engine.l3_keys(list(range(7, 7 + 2 * size)))
            engine.write_back(more, page_tokens(host, size)).wait()
            write_error = ""
        except RuntimeError as e:
            write_error = str(e)
        kept = first_mismatch(engine, [0, 1], expected)
        handle = engine.load(page_tokens(host, size), page_tokens([2, 3], size))
        forward(engine, handle)
        handle.done(engine.runtime.forward_stream).wait()
        return {
            "found": found,
            "hits": loaded.hits,
            "write_error": write_error,
            "device_kept": kept,
            "host_kept": first_mismatch(engine, [2, 3], expected),
        }
    finally:
        engine.close()


GRID_PAGES = 3


def grid_tokens(index: int, count: int) -> list[int]:
    """Writer `index`'s prefix: token ids no other writer uses."""
    return list(range(index * 1_000_000, index * 1_000_000 + count))


def write_prefix(args: tuple[Job, int], rank: int, world_size: int, local_rank: int) -> int:
    """Fill, back up and write back writer `index`'s prefix (its bytes drawn from its index,
    so any reader can draw them again); the pages it wrote."""
    job, index = args
    engine = open_engine(job.recipe(), local_rank)
    try:
        size, pages = engine.sizing.slots_per_page, list(range(GRID_PAGES))
        fill_random(engine, pages, 1000 + index)
        host = engine.host_allocator.alloc(GRID_PAGES)
        engine.backup(page_tokens(host, size), page_tokens(pages, size)).wait()
        keys = engine.l3_keys(grid_tokens(index, GRID_PAGES * size))
        engine.write_back(keys, page_tokens(host, size)).wait()
        while engine.acks.pending:
            engine.poll()
        return len(keys)
    finally:
        engine.close()


def write_prefixes(
    args: list[tuple[Job, int]], rank: int, world_size: int, local_rank: int
) -> list[int]:
    """`write_prefix` of each (job, writer index) in turn: their engines one after another in
    one launch's world."""
    return [write_prefix(one, rank, world_size, local_rank) for one in args]


def read_prefixes_of(
    args: list[tuple[Job, int]], rank: int, world_size: int, local_rank: int
) -> list[list]:
    """`read_prefixes` of each (job, writers) in turn, in one launch's world."""
    return [read_prefixes(one, rank, world_size, local_rank) for one in args]


def read_prefixes(args: tuple[Job, int], rank: int, world_size: int, local_rank: int) -> list:
    """Look up and load every writer's prefix from L3 into poisoned device pages: per writer,
    (pages found, pages loaded, the first byte of them that differs from what it wrote, or
    ''); then
    where the reads landed ('pool' straight into pool rows, 'staging' through a buffer)."""
    job, writers = args
    engine = open_engine(job.recipe(), local_rank, keep_trace=True)
    try:
        size, pages = engine.sizing.slots_per_page, list(range(GRID_PAGES))
        target = [p + GRID_PAGES for p in pages]
        found: list = []
        for index in range(writers):
            fill_random(engine, pages, 1000 + index)
            expected = snapshot(engine, pages)
            poison(engine, target)
            keys = engine.l3_keys(grid_tokens(index, GRID_PAGES * size))
            hits = engine.lookup(keys)
            loaded, fresh = loaded_from_l3(engine, keys, target)
            while engine.acks.pending:
                engine.poll()
            engine.host_allocator.free(fresh)
            n = loaded.hits
            exact = {u: e[:n] for u, e in expected.items()}
            found.append((hits, n, first_mismatch(engine, target[:n], exact) if n else ""))
        reads = [op["into"] for op in engine.trace.ops if op["op"] == "l3_read"]
        return [*found, sorted(set(reads))]
    finally:
        engine.close()


def admitted(jobs: list[Job], rank: int, world_size: int, local_rank: int) -> list[dict]:
    """Per job (storage.write_admission=after_hits, admit_after_hits=2): a one-off prefix
    looked up once and written back, and a repeated one written back after its first lookup
    and again after its second; what a lookup then finds of each (on every rank) and the
    admission counts."""
    return on_each(jobs, local_rank, _admitted)


def on_each(
    jobs: list[Job], local_rank: int, run: Callable[[Engine], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`run` on a fresh engine of each job in turn, each closed after it."""
    found = []
    for job in jobs:
        engine = open_engine(job.recipe(), local_rank)
        try:
            found.append(run(engine))
        finally:
            engine.close()
    return found


def _admitted(engine: Engine) -> dict[str, Any]:
    size, pages = engine.sizing.slots_per_page, list(range(GRID_PAGES))
    fill_random(engine, pages, 5)
    host = engine.host_allocator.alloc(GRID_PAGES)
    engine.backup(page_tokens(host, size), page_tokens(pages, size)).wait()
    one_off, repeated = (engine.l3_keys(grid_tokens(i, GRID_PAGES * size)) for i in (7, 8))

    def written_back(keys: list[str]) -> int:
        engine.write_back(keys, page_tokens(host, size)).wait()
        while engine.acks.pending:  # every rank's part is stored once all are released
            engine.poll()
        return int(engine.stats()["hicache_l3_write_admitted_pages_total"])

    seen = [engine.lookup(one_off), engine.lookup(repeated)]
    written_back(one_off)
    admitted_first = written_back(repeated)  # both named once: neither stored
    seen.append(engine.lookup(repeated))  # named twice now
    admitted_then = written_back(repeated)
    stats = engine.stats()
    return {
        "seen": seen,
        "admitted": [admitted_first, admitted_then],
        "declined": int(stats["hicache_l3_write_declined_pages_total"]),
        "found": [engine.lookup(one_off), engine.lookup(repeated)],
    }


def queue_bounded(jobs: list[Job], rank: int, world_size: int, local_rank: int) -> list[dict]:
    """Per job (storage.write_back_queue_pages=GRID_PAGES): two write-backs with the first's
    release held back (no poll between), then a third after the polls that release both;
    the pages each stored, dropped and found (on every rank)."""
    return on_each(jobs, local_rank, _queue_bounded)


def _queue_bounded(engine: Engine) -> dict[str, Any]:
    size, pages = engine.sizing.slots_per_page, list(range(GRID_PAGES))
    fill_random(engine, pages, 6)
    host = page_tokens(engine.host_allocator.alloc(GRID_PAGES), size)
    engine.backup(host, page_tokens(pages, size)).wait()
    keys = [engine.l3_keys(grid_tokens(i, GRID_PAGES * size)) for i in (11, 12, 13)]
    waits = [engine.write_back(keys[0], host), engine.write_back(keys[1], host)]
    for event in waits:
        event.wait()
    while engine.acks.pending:  # released on every rank alike
        engine.poll()
    engine.write_back(keys[2], host).wait()
    while engine.acks.pending:
        engine.poll()
    stats = engine.stats()
    return {
        "admitted": int(stats["hicache_l3_write_admitted_pages_total"]),
        "dropped": int(stats["hicache_l3_write_dropped_pages_total"]),
        "found": [engine.lookup(k) for k in keys],
    }


def store_cli(capsys: Any, *args: str) -> tuple[int, dict]:
    """Exit code and JSON document of `hicache-pipeline store ARGS --json`, run in-process."""
    try:
        main(["store", *args, "--json"])
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, json.loads(capsys.readouterr().out)
