"""Ack tracking: every rank releases the same finished transfers in the same scheduler step.

Acks queue in submission order. `poll()` counts the leading acks whose event has fired on this
rank, all-gathers that count over the group (with the poll's sequence number and the acks
outstanding, so that ranks that poll a different number of times, or with different work
outstanding, are named instead of pairing the wrong collectives) and pops the smallest count
everywhere. `poll()` is a collective: every rank calls it the same number of times, in the
same order as the engine's other collectives; a rank-local wait is `Event.query()`. The
gather costs a collective per step even when nothing is in flight; the idle-sync skip leaves it out
while the ledger is empty and no storage backend is attached. The skip decision may read only
rank-replicated state (the ledger, never an event's status, an allocation outcome or the time):
`rank_consensus` checks that in debug mode, and every `max_skips` skips one sync is forced that
also compares a digest of the replicated state across ranks.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pipeline.engine.comms import Group
from pipeline.engine.cuda.streams import Event
from pipeline.engine.poll_notes import PollNotes

log = logging.getLogger("hicache-pipeline")


@dataclass
class Ack:
    """One submitted transfer awaiting release."""

    seq: int
    kind: str
    """'backup', 'load' or 'write_back'."""
    event: Event
    payload: Any = None
    """What the caller releases when the ack pops (pages, a request)."""
    pages: int = 0
    """Host pages it holds until then (a write-back's: its bound counts them)."""
    submitted_s: float = field(default_factory=time.monotonic)
    """When it was submitted (the latency metrics time it to its release)."""

    def query(self) -> bool:
        """Has this rank's part completed? Rank-local, no collective: a rank may wait on it
        alone; the ack is released (on every rank alike) by `Engine.poll`."""
        return self.event.query()


IdleCheck = Callable[["AckLedger"], tuple[bool, tuple]]
"""(may skip the reduce, the inputs the decision read): inputs must be rank-replicated."""


def replicated_idle(ledger: AckLedger) -> tuple[bool, tuple]:
    """Nothing submitted is outstanding, and no storage backend may hold acks back."""
    inputs = (len(ledger.pending), ledger.storage_attached)
    return not ledger.pending and not ledger.storage_attached, inputs


def rank_consensus(label: str, inputs: tuple, group: Group) -> None:
    """All-gather `inputs` and raise if any rank's differ (a decision would diverge)."""
    gathered = group.all_gather_object(inputs)
    if any(g != gathered[0] for g in gathered):
        per_rank = "; ".join(f"rank {r}: {g}" for r, g in enumerate(gathered))
        raise RuntimeError(
            f"rank_consensus: ranks disagree on {label} ({per_rank}); the "
            "decision must read only rank-replicated state"
        )


@dataclass
class PollStats:
    """What the polls of one ledger did (compared across ranks by `simulate`)."""

    polls: int = 0
    reduces: int = 0
    skipped: int = 0
    forced: int = 0
    poll_s: float = 0.0
    decisions: deque[tuple[bool, int]] = field(default_factory=lambda: deque(maxlen=64))
    """The latest polls' (skipped the reduce, acks popped), for a reader."""
    decisions_digest: int = 0
    """A running digest of every poll's decision, compared across ranks (a fixed size however
    long the ledger lives)."""


class AckLedger:
    """The ordered acks of one rank and the consensus poll over `group` (a gloo group); a
    poll that waits long is told to the other ranks through `notes` (None: to none)."""

    def __init__(
        self,
        group: Group,
        *,
        skip_enabled: bool,
        max_skips: int,
        storage_attached: bool,
        debug_consensus: bool,
        poll_timer_every: int,
        idle: IdleCheck = replicated_idle,
        notes: PollNotes | None = None,
    ) -> None:
        assert max_skips >= 1, "IdleSyncSkipConfig checks max_skips"
        self.group = group
        self.skip_enabled = skip_enabled
        self.max_skips = max_skips
        self.storage_attached = storage_attached
        self.debug_consensus = debug_consensus
        self.poll_timer_every = poll_timer_every
        self.idle = idle
        self.notes = notes
        self.pending: deque[Ack] = deque()
        self.stats = PollStats()
        self.rank, self.size = group.rank, group.size
        self._agreed = 0
        """The last poll every rank joined."""
        self._next_seq = 0
        self._skips = 0

    def submit(self, kind: str, event: Event, payload: Any = None, pages: int = 0) -> Ack:
        ack = Ack(self._next_seq, kind, event, payload, pages)
        self._next_seq += 1
        self.pending.append(ack)
        return ack

    def held_pages(self, kind: str) -> int:
        """Host pages the pending acks of `kind` hold: the same on every rank (the ledger is
        rank-replicated), so a decision made from it is made alike."""
        return sum(ack.pages for ack in self.pending if ack.kind == kind)

    def poll(self, state_digest: Callable[[], int]) -> list[Ack]:
        """Pop the acks every rank has seen complete; the same ones on every rank (a
        collective: RuntimeError naming each rank's poll count and outstanding acks where
        they differ, or naming this rank's where a peer does not join within the group's
        timeout)."""
        start = time.perf_counter()
        if self.notes is not None:
            self.notes.begun = self.stats.polls + 1
        idle, inputs = self.idle(self)
        if self.debug_consensus:
            rank_consensus("the idle-sync skip inputs", (*inputs, self._skips), self.group)
        if self.skip_enabled and idle and self._skips < self.max_skips:
            self._skips += 1
            self.stats.skipped += 1
            return self._done(start, skipped=True, popped=[])
        forced = self.skip_enabled and self._skips >= self.max_skips
        self._skips = 0
        ready = 0
        for ack in self.pending:  # leading acks only: release stays in submission order
            if not ack.event.query():
                break
            ready += 1
        digest = state_digest() if forced else 0
        mine = (self.stats.polls + 1, len(self.pending), ready, digest)
        rows = self._gathered(mine)
        self.stats.reduces += 1
        if len({row[:2] for row in rows}) > 1:
            per_rank = "; ".join(
                f"rank {r}: poll #{p} with {n} acks outstanding"
                for r, (p, n, *_) in enumerate(rows)
            )
            raise RuntimeError(
                f"poll: the ranks are not at the same poll ({per_rank}). poll() is a "
                "collective: every rank must call it the same number of times, with the "
                "same transfers submitted; wait on one rank with Event.query() / "
                "LoadHandle.query() instead, then poll on every rank"
            )
        if forced:
            self.stats.forced += 1
            if len({row[3] for row in rows}) > 1:
                raise RuntimeError(
                    "forced sync after idle skips: ranks hold different replicated state "
                    "(host allocator free list or ack ledger digests differ)"
                )
        popped = [self.pending.popleft() for _ in range(min(row[2] for row in rows))]
        self._agreed = self.stats.polls + 1
        if self.notes is not None:
            self.notes.agreed = self._agreed
        return self._done(start, skipped=False, popped=popped)

    def _gathered(self, mine: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every rank's (poll #, acks outstanding, acks ready, digest), in rank order; a peer
        that does not join within the group's timeout is named as the poll it was last seen
        at, never as slow."""
        rows = [torch.zeros(len(mine), dtype=torch.int64) for _ in range(self.size)]
        notes = self.notes  # where this rank waits, for a peer that skipped this poll to read
        try:
            stuck = None if notes is None else notes.in_poll(mine[0], mine[1])
            self.group.all_gather(rows, torch.tensor(mine, dtype=torch.int64), stuck)
            if notes is not None:
                notes.done()
        except RuntimeError as e:
            peers = ", ".join(str(r) for r in range(self.size) if r != self.rank)
            raise RuntimeError(
                f"poll: this rank (rank {self.rank}) is at poll #{mine[0]} with {mine[1]} acks "
                f"outstanding, and rank(s) {peers} did not join it: all {self.size} ranks were "
                f"last together at poll #{self._agreed}. poll() is a collective: every rank must "
                "call it the same number of times (a rank-local loop such as `while not "
                "ack.query(): engine.poll()` breaks that: wait with Event.query() / "
                f"LoadHandle.query(), then poll on every rank) ({e})"
            ) from e
        return [tuple(int(v) for v in row) for row in rows]

    def _done(self, start: float, *, skipped: bool, popped: list[Ack]) -> list[Ack]:
        stats = self.stats
        stats.polls += 1
        stats.poll_s += time.perf_counter() - start
        decision = (skipped, len(popped))
        stats.decisions.append(decision)
        stats.decisions_digest = zlib.crc32(repr(decision).encode(), stats.decisions_digest)
        every = self.poll_timer_every
        if every and stats.polls % every == 0:
            log.info(
                "poll: mean %.3f ms over %d polls (%d reduces, %d skipped)",
                stats.poll_s / stats.polls * 1e3,
                stats.polls,
                stats.reduces,
                stats.skipped,
            )
        return popped


def digest_of(*parts: object) -> int:
    """A stable 31-bit digest of replicated state (the same value on every rank for equal
    state; unlike hash(), not salted per process)."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF
