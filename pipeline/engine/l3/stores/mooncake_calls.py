"""Calls into a Mooncake client, each bounded by runtime.timeout_s.

The client waits up to its own RPC timeout (30 s, fixed: no option of its setup changes it)
for a master that stopped answering, once per call, and a load makes several. Here each call
runs on a worker thread and the caller waits at most `timeout_s` for it (the client lets go
of Python's lock while it waits, so the caller can stop waiting); until the call that did not
answer in time returns, every later call fails at once instead of queueing behind it, and then
the store is tried again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger("hicache-pipeline")

T = TypeVar("T")


class MasterSilent(RuntimeError):
    """The Mooncake master did not answer a call within runtime.timeout_s."""


class BoundedCalls:
    """Runs a client's calls on `workers` threads, each waited for at most `timeout_s`
    (MasterSilent, naming `master`, when it is not back by then)."""

    def __init__(self, master: str, timeout_s: float, workers: int) -> None:
        self.master, self.timeout_s = master, timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mooncake-call")
        self._silent: Future[Any] | None = None
        """The call that did not answer in time, while it has not returned."""
        self._lock = threading.Lock()

    @property
    def message(self) -> str:
        return (
            f"the Mooncake master at {self.master} did not answer within "
            f"runtime.timeout_s={self.timeout_s:g} s"
        )

    def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread; its result, its error, or MasterSilent."""
        with self._lock:
            if self._silent is not None and not self._silent.done():
                raise MasterSilent(self.message)
            future = self._pool.submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            with self._lock:
                first = self._silent is None or self._silent.done()
                self._silent = future
            if first:  # once per silence: every call during it fails the same way
                log.warning("%s: reads are misses and writes fail until it answers", self.message)
            raise MasterSilent(self.message) from None

    def close(self) -> None:
        """Stop the workers (one still waiting on the client ends when the client answers)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
