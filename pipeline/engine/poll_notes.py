"""Where a rank's poll waits, told to the engine's other ranks through the default store.

A rank that skips a `poll()` its peers make waits somewhere else, typically in a load's
broadcast, which its peers, waiting in the poll, never join. Its own wait can tell only that
it did not complete; the peers' poll is what names the mistake. So a poll that has waited
`grace_s` writes its number under the engine's prefix (only then: a poll that completes at
once costs no store call), and a collective of the engine's that has waited half the
timeout reads its peers' notes: one waiting in a poll this rank has not begun is named, in
the poll's own words, instead of waiting out the timeout.
"""

from __future__ import annotations

import torch.distributed as dist

from pipeline.engine.comms import Stuck

UNSKIPPABLE = (
    "poll() is a collective: every rank must call it the same number of times, in the same "
    "order as the engine's other collectives (a rank-local condition must not skip it: wait "
    "with Event.query() / LoadHandle.query(), then poll on every rank)"
)


class PollNotes:
    """This rank's poll, as its peers may read it, and theirs as it reads them."""

    def __init__(
        self, store: dist.Store, prefix: str, rank: int, size: int, timeout_s: float
    ) -> None:
        self.store, self.prefix = store, prefix
        self.rank, self.size = rank, size
        """This rank's TP rank, and the engine's ranks."""
        self.timeout_s = timeout_s
        self.begun = 0
        """The polls this rank has begun (skipped ones too: every rank skips the same)."""
        self.agreed = 0
        """The last poll every rank joined."""
        self._told = False

    def _key(self, rank: int) -> str:
        return f"{self.prefix}/poll/{rank}"

    def in_poll(self, poll: int, outstanding: int) -> Stuck:
        """A poll's `stuck` callback: this rank has waited a while in poll #`poll` (with
        `outstanding` acks)."""

        def waiting(_: float) -> None:
            self.store.set(self._key(self.rank), f"{poll} {outstanding}")
            self._told = True

        return waiting

    def done(self) -> None:
        """This rank's poll has completed: it waits in none. (The key stays, emptied: a
        peer's read between its check and its get never waits for a deleted key.)"""
        if self._told:
            self.store.set(self._key(self.rank), "")
            self._told = False

    def skipped(self) -> str | None:
        """What a peer waiting in a poll that this rank has not begun says, or None."""
        for peer in range(self.size):
            key = self._key(peer)
            if peer == self.rank or not self.store.check([key]):
                continue
            note = self.store.get(key).decode().split()
            if note and int(note[0]) > self.begun:
                poll, outstanding = note
                return (
                    f"poll: rank {peer} waits in poll #{poll} with {outstanding} acks "
                    f"outstanding, which this rank (rank {self.rank}) has not made: it has "
                    f"begun {self.begun} polls, and all {self.size} ranks were last together "
                    f"at poll #{self.agreed}. {UNSKIPPABLE}"
                )
        return None

    def stuck(self, what: str) -> Stuck:
        """A collective's `stuck` callback: from half the timeout on, raise where a peer waits
        in a poll this rank skipped (`what`: where this rank waits instead)."""

        def check(waited_s: float) -> None:
            if waited_s >= self.timeout_s / 2 and (said := self.skipped()) is not None:
                raise RuntimeError(f"{said} (this rank waits in {what} instead)")

        return check
