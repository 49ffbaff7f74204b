"""`simulate`: a randomized scheduler on real ranks proves the ack poll and its idle-sync skip.

Every rank runs the same scheduler (seeded identically): requests arrive, prefix hits load
back through the engine, misses prefill and back up, evictions free host pages, and every step
polls the ack ledger. Each ack's event fires after a rank-local random number of polls once
the real transfer is done (per-rank jitter), so ranks see acks complete at different steps and
only the MIN-reduce makes them release the same ones. The run repeats with the skip off and on;
it reports reduces issued vs skipped, poll time, whether every rank made the same decisions
and ended in the same state, and whether skip on and off ended in the same cache state.
"""

from __future__ import annotations

import random
from typing import Any

from pipeline.config.job import Job
from pipeline.config.schema import SimulateConfig
from pipeline.core.slots import PageAllocator, page_tokens
from pipeline.engine.acks import AckLedger, IdleCheck, digest_of, replicated_idle
from pipeline.engine.cuda.streams import Event
from pipeline.engine.engine import Engine
from pipeline.engine.factory import open_engine
from pipeline.jobs.contents import fill_random
from pipeline.jobs.progress import progress


class JitteredEvent:
    """A transfer's ack event that this rank only sees fire after `delay_polls` more polls."""

    def __init__(self, event: Event, delay_polls: int) -> None:
        self.event, self.delay_polls = event, delay_polls

    def query(self) -> bool:
        if self.delay_polls > 0:
            self.delay_polls -= 1
            return False
        return self.event.query()

    def settled(self) -> bool:
        return self.event.settled()  # the device's truth, not this rank's delayed view

    def wait(self) -> None:
        self.event.wait()

    def fail(self, error: BaseException) -> None:
        self.event.fail(error)


def local_event_idle(ledger: AckLedger) -> tuple[bool, tuple]:
    """The deliberately wrong predicate: "nothing in flight on this rank" reads event status,
    which differs between ranks, so ranks decide differently (the negative control)."""
    done = all(ack.event.query() for ack in ledger.pending)
    return done and not ledger.storage_attached, (done,)


PREDICATES: dict[str, IdleCheck] = {"ledger": replicated_idle, "event_status": local_event_idle}


class Scheduler:
    """One run of the randomized scheduler on one rank (the same draws on every rank)."""

    def __init__(self, engine: Engine, cfg: SimulateConfig, seed: int, rank: int) -> None:
        self.engine, self.cfg = engine, cfg
        self.device = PageAllocator(engine.sizing.device_pages)
        self.shared = random.Random(seed)  # replicated: every rank draws the same
        self.jitter = random.Random(seed * 7919 + rank)  # rank-local
        self.cached: dict[int, list[int]] = {}  # prefix -> host pages, least recent first
        self.reading: dict[int, int] = {}  # prefix -> loads in flight (not evictable)
        self.writing: set[int] = set()  # prefixes whose backup is in flight

    def run(self, skip: bool) -> dict[str, Any]:
        engine, cfg = self.engine, self.cfg
        engine.acks = AckLedger(
            engine.runtime.cpu_group,
            skip_enabled=skip,
            max_skips=cfg.max_skips,
            storage_attached=False,
            debug_consensus=cfg.debug_consensus,
            poll_timer_every=0,
            idle=PREDICATES[cfg.predicate.value],
        )
        engine.host_allocator = PageAllocator(engine.sizing.host.num_pages)
        for _ in progress(range(cfg.steps), "simulate steps", rank=engine.runtime.rank):
            if self.shared.random() < cfg.arrive_prob:
                self._arrive(self.shared.randrange(cfg.num_prefixes))
            for ack in engine.poll():
                self._release(ack.payload)
        while engine.acks.pending:  # drain: the ledger is the same on every rank
            for ack in engine.poll():
                self._release(ack.payload)
        stats = engine.acks.stats
        state = digest_of(sorted(self.cached.items()), engine.host_allocator.free_pages())
        return {
            "reduces": stats.reduces,
            "skipped": stats.skipped,
            "forced": stats.forced,
            "polls": stats.polls,
            "poll_ms": stats.poll_s / max(stats.polls, 1) * 1e3,
            "decisions": stats.decisions_digest,
            "state": state,
        }

    def _arrive(self, prefix: int) -> None:
        """A hit loads the prefix back; a miss prefills fresh slots and backs them up."""
        engine, size = self.engine, self.engine.sizing.slots_per_page
        if prefix in self.cached:
            host = self.cached.pop(prefix)
            self.cached[prefix] = host  # most recently used
            if self.device.num_free < len(host):
                return
            target = self.device.alloc(len(host), self.shared)
            handle = engine.load(page_tokens(host, size), page_tokens(target, size))
            engine.begin_forward(engine.runtime.forward_stream)
            handle.done(engine.runtime.forward_stream)
            self.reading[prefix] = self.reading.get(prefix, 0) + 1
            self._jitter(("load", prefix, target))
            return
        pages = self.shared.randint(1, self.cfg.max_pages)
        if prefix in self.writing or self.device.num_free < pages:
            return
        target = self.device.alloc(pages, self.shared)
        fill_random(engine, target, seed=self.shared.randrange(1 << 30))
        host_alloc = engine.host_allocator
        evictable = [p for p in self.cached if not self.reading.get(p)]
        while host_alloc.num_free < pages and evictable:
            host_alloc.free(self.cached.pop(evictable.pop(0)))
        if host_alloc.num_free < pages:
            self.device.free(target)
            return
        host = host_alloc.alloc(pages, self.shared)
        engine.backup(page_tokens(host, size), page_tokens(target, size))
        self.writing.add(prefix)
        self._jitter(("backup", prefix, target, host))

    def _release(self, payload: tuple) -> None:
        kind, prefix, target, *host = payload
        self.device.free(target)
        if kind == "backup":
            self.cached[prefix] = host[0]
            self.writing.discard(prefix)
        else:
            self.reading[prefix] -= 1

    def _jitter(self, payload: tuple) -> None:
        ack = self.engine.acks.pending[-1]
        # The transfer is waited for here, so when each rank sees its ack fire is set by the
        # seeded jitter alone. Left to the machine's speed, a transfer that ran long in one run
        # released its ack a step later than in the other run (seen once under load), and the
        # runs with the skip off and on ended in different, equally valid, states.
        ack.event.wait()
        ack.event = JitteredEvent(ack.event, self.jitter.randint(0, self.cfg.max_jitter_polls))
        ack.payload = payload


def simulate_rank(job: Job, rank: int, world_size: int, local_rank: int) -> list[dict[str, Any]]:
    """Every seed with the skip off, then on, on one rank."""
    engine = open_engine(job.recipe(), local_rank)
    cfg = job.simulate
    try:
        return [
            {"seed": seed, "skip": skip, **Scheduler(engine, cfg, seed, rank).run(skip)}
            for seed in cfg.seeds
            for skip in (False, True)
        ]
    finally:
        engine.close()


def summarize(ranks: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per seed: reduces and poll time with the skip off and on, and the agreement checks."""
    runs = []
    for i in range(0, len(ranks[0]), 2):
        off, on = ranks[0][i], ranks[0][i + 1]
        runs.append(
            {
                "seed": off["seed"],
                "reduces_off": off["reduces"],
                "reduces_on": on["reduces"],
                "skipped": on["skipped"],
                "forced": on["forced"],
                "poll_ms_off": off["poll_ms"],
                "poll_ms_on": on["poll_ms"],
                "ranks_agree": all(
                    r[j]["decisions"] == ranks[0][j]["decisions"]
                    and r[j]["state"] == ranks[0][j]["state"]
                    for r in ranks
                    for j in (i, i + 1)
                ),
                "skip_on_equals_off": off["state"] == on["state"],
            }
        )
    return {
        "ranks": len(ranks),
        "runs": runs,
        "ok": all(r["ranks_agree"] and r["skip_on_equals_off"] for r in runs),
    }
