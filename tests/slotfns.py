"""Rank functions of the host-slot lifecycle (spawned ranks, real gloo groups): only the
engine's public calls allocate, free and reuse host slots."""

from __future__ import annotations

from typing import Any

from pipeline.config.job import Job
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot
from pipeline.jobs.run import forward


def refused(call: Any) -> str:
    """What `call` says as a ValueError ('' when it succeeds)."""
    try:
        call()
    except ValueError as e:
        return str(e)
    return ""


def drained(engine: Engine) -> None:
    while engine.acks.pending:  # every rank releases the same acks in the same poll
        engine.poll()


def host_slot_lifecycle(job: Job, rank: int, world_size: int, local_rank: int) -> dict:
    """Back up 2 pages into allocated host slots and write them back; reuse the same slots
    for a load_from_l3 of those pages into other device pages; free them, then the mistakes
    a scheduler can make. Returns what each step gave or said."""
    engine = open_engine(job.recipe(), local_rank)
    try:
        return _lifecycle(engine)
    finally:
        engine.close()


def _lifecycle(engine: Engine) -> dict[str, Any]:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    free_before = slots.num_free
    host = slots.alloc(2 * size)
    fill_random(engine, [0, 1], 21 + engine.runtime.replica_group[0])
    expected = snapshot(engine, [0, 1])
    engine.backup(host, page_tokens([0, 1], size)).wait()
    keys = engine.l3_keys(list(range(2 * size)))
    engine.write_back(keys, host).wait()
    drained(engine)
    held = refused(lambda: engine.load_from_l3(keys, host, page_tokens([4, 5], size)))
    slots.reuse(host)  # the same host slots, now free to be read into
    poison(engine, [4, 5])
    loaded = engine.load_from_l3(keys, host, page_tokens([4, 5], size))
    assert loaded.handle is not None
    forward(engine, loaded.handle)
    loaded.handle.done(engine.runtime.forward_stream).wait()
    drained(engine)
    slots.free(host)
    again = slots.alloc(2 * size)
    slots.free(again)
    return {
        "host": host.tolist(),
        "held": held,
        "hits": loaded.hits,
        "loaded": first_mismatch(engine, [4, 5], expected),
        "again": again.tolist(),
        "free_after": slots.num_free == free_before,
        "double_free": refused(lambda: slots.free(host)),
        "out_of_range": refused(lambda: slots.free(page_tokens([slots.num_slots // size], size))),
        "reuse_free": refused(lambda: slots.reuse(host)),
        "partial": refused(lambda: slots.alloc(size + 1)),
        "too_many": refused(lambda: slots.alloc(slots.num_slots + size)),
        "digest": engine.state_digest(),
    }
