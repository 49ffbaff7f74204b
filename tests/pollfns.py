"""Rank functions for `poll()` called unevenly: one rank polls once more than its peer."""

from __future__ import annotations

import time

import torch.distributed as dist

import pipeline
from pipeline.config.job import Job
from pipeline.core.slots import page_tokens


def extra_poll(args: tuple[Job, bool], rank: int, world_size: int, local_rank: int) -> dict:
    """Each rank backs up a page and polls; the last rank polls once more. `idle`: its extra
    poll comes while nothing is outstanding (the idle skip leaves the collective out, so the
    next common poll meets the counts apart), else with an ack outstanding (the extra poll
    waits for a peer that never comes). What each rank's failing poll said, and when."""
    job, idle = args
    engine = pipeline.create_engine(job)
    said, start = "", time.monotonic()
    try:
        size = engine.sizing.slots_per_page
        host = engine.host_slots.alloc(size)
        odd_one = rank == world_size - 1
        if idle and odd_one:
            engine.poll()  # skipped: the ledger is empty
        ack = engine.backup(host, page_tokens([0], size))
        ack.wait()
        try:
            engine.poll()  # idle: the counts differ here
            if not idle and odd_one:
                engine.backup(host, page_tokens([1], size)).wait()
                engine.poll()  # its peer never polls again
        except RuntimeError as e:
            said = str(e)
        return {"said": said, "after_s": time.monotonic() - start}
    finally:
        dist.barrier()  # the peer waits here for the odd one's error (the world's group)
        engine.close()


def skipped_poll(job: Job, rank: int, world_size: int, local_rank: int) -> dict:
    """Each rank backs up a page; rank 0 polls (an ack outstanding) and rank 1 skips that
    poll and loads the page back, whose broadcast rank 0 never joins: what each rank's
    failing call said."""
    engine = pipeline.create_engine(job)
    said = ""
    try:
        size = engine.sizing.slots_per_page
        host = engine.host_slots.alloc(size)
        engine.backup(host, page_tokens([0], size)).wait()
        try:
            if rank == 0:
                engine.poll()  # rank 1 never makes this poll
            else:
                engine.load(host, page_tokens([1], size)).done().wait()
        except (RuntimeError, TimeoutError) as e:
            said = str(e)
        return {"said": said}
    finally:
        dist.barrier()  # each waits here for the other's error (the world's group)
        engine.close()
