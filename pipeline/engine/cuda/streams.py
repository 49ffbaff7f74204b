"""Streams and events: CUDA streams, and CPU worker threads that stand in for them.

On CPU a `WorkerStream` is one thread that runs submitted work in order, so a transfer issued on
it overlaps the caller exactly as a CUDA stream overlaps the host: the caller can wait for layer 0
while later layers are still moving. An error on a worker is kept and re-raised by every wait.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pipeline.engine.cuda.cudart import Cudart

log = logging.getLogger("hicache-pipeline")


class Event(Protocol):
    """Completion marker recorded on a stream."""

    def wait(self) -> None:
        """Block the calling thread until the event completes; re-raise the stream's error."""

    def query(self) -> bool:
        """Has the event completed? (An event never recorded has.)"""

    def settled(self) -> bool:
        """Has the event been recorded and completed? (Nothing issued before it still runs.)"""

    def fail(self, error: BaseException) -> None:
        """Complete a pending event with `error`, so its waiters raise instead of hanging."""


class Stream(Protocol):
    """An ordered queue of work: a CUDA stream, or a CPU thread standing in for one."""

    def submit(self, work: Any) -> None:
        """Run `work()` in this stream's order (issue on CUDA, execute on a CPU worker)."""

    def new_event(self) -> Event:
        """An event to be recorded later (created up front so waiters can hold it)."""

    def record(self, event: Any) -> None:
        """Record `event` (one this stream's kind made) at the current end of this stream."""

    def wait_event(self, event: Any) -> None:
        """Make later work on this stream wait for `event`."""

    def synchronize(self) -> None:
        """Block the calling thread until all work submitted so far is done."""

    def close(self) -> None:
        """Stop the stream's worker, if it has one."""


def follow(stream: Stream, other: Stream) -> None:
    """Make later work on `stream` wait for everything submitted to `other` so far."""
    event = other.new_event()
    other.record(event)
    stream.wait_event(event)


class CpuEvent:
    """A threading.Event that carries the error of the transfer that should have set it, and
    gives up waiting after the collective timeout."""

    def __init__(self, timeout_s: float) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.timeout_s = timeout_s

    def set(self, error: BaseException | None = None) -> None:
        """Complete the event (the first completion wins: a failed event stays failed)."""
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def wait(self) -> None:
        if not self._done.wait(self.timeout_s):
            raise TimeoutError(
                f"a transfer did not complete within runtime.timeout_s={self.timeout_s:g} s: "
                "raise runtime.timeout_s if it is only slow"
            )
        if self._error is not None:
            raise RuntimeError(f"transfer failed: {self._error}") from self._error

    def query(self) -> bool:
        return self._done.is_set()

    def settled(self) -> bool:
        return self._done.is_set()  # set only once the stream reaches its record

    def fail(self, error: BaseException) -> None:
        self.set(error)


class WorkerStream:
    """A CPU stream: one daemon thread runs submitted callables in submission order.

    Work submitted, recorded or awaited from inside the worker runs at once: it is already at
    the head of the stream. An error ends only the work that raised it: the transfer it
    belongs to has failed its own events (`Transfer.fail`), and later work, a later transfer's
    included, still runs.
    """

    def __init__(self, name: str, timeout_s: float) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def _on_worker(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, work: Callable[[], Any]) -> None:
        if self._on_worker():
            work()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(work)

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                work()
            except BaseException as e:  # its transfer carries it; the stream goes on
                log.debug("stream %s: %s", self.name, e)

    def new_event(self) -> CpuEvent:
        return CpuEvent(self.timeout_s)

    def record(self, event: CpuEvent) -> None:
        self.submit(event.set)

    def wait_event(self, event: CpuEvent) -> None:
        self.submit(event.wait)

    def synchronize(self) -> None:
        event = self.new_event()
        self.record(event)
        event.wait()

    def close(self) -> None:
        """Stop the worker; one stuck in a collective is left behind after the timeout (it is
        a daemon: it ends with the process)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(self.timeout_s)
            self._thread = None


class InlineStream:
    """The calling thread as a stream: work runs at once, waits block the caller."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def submit(self, work: Callable[[], Any]) -> None:
        work()

    def new_event(self) -> CpuEvent:
        return CpuEvent(self.timeout_s)

    def record(self, event: CpuEvent) -> None:
        event.set()

    def wait_event(self, event: CpuEvent) -> None:
        event.wait()

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass


class CudaEvent:
    """A CUDA event made when first recorded: making one costs the host time, and a transfer
    holds one or two per layer, so made up front they would delay its first copy. Before its
    record it behaves as an unrecorded CUDA event: complete, and waits pass. A failed
    transfer's events carry its error, which `wait` raises. Its calls are cudart's own
    (`Cudart`), not torch's wrappers: the issue path records one or two per layer."""

    __slots__ = ("api", "error", "external", "handle", "timeout_s")

    def __init__(self, api: Cudart, timeout_s: float, *, external: bool = False) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self.external = external
        """Recorded inside a CUDA graph, waited on outside it."""
        self.handle = 0
        """The cudaEvent_t, once recorded."""
        self.error: BaseException | None = None

    def __del__(self) -> None:
        if self.handle:
            self.api.release(self.handle)

    def record(self, stream: int) -> None:
        if not self.handle:
            self.handle = self.api.new_event()
        self.api.record(self.handle, stream, external=self.external)

    def wait(self) -> None:
        """Block until the event completes, at most the collective timeout (by polling: a
        CUDA event's own synchronize cannot be given one)."""
        deadline, pause = time.monotonic() + self.timeout_s, 50e-6
        while not self.query():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"a transfer did not complete within runtime.timeout_s={self.timeout_s:g} "
                    "s: raise runtime.timeout_s if it is only slow"
                )
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        if self.error is not None:
            raise RuntimeError(f"transfer failed: {self.error}") from self.error

    def query(self) -> bool:
        return not self.handle or self.api.query(self.handle)

    def settled(self) -> bool:
        return bool(self.handle) and self.api.query(self.handle)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error


class CudaStream:
    """A CUDA stream: `submit` issues the work on it from the calling thread."""

    def __init__(self, stream: torch.cuda.Stream, timeout_s: float, api: Cudart) -> None:
        self.stream = stream
        self.timeout_s = timeout_s
        self.api = api
        self.handle: int = stream.cuda_stream
        """The cudaStream_t, read once."""

    def submit(self, work: Callable[[], Any]) -> None:
        # torch's own calls, not `with torch.cuda.stream(...)` nor `torch.cuda.current_stream`:
        # those look the device up and make a Stream object through Python helpers, a cost
        # a chunked backup pays on every batch (BENCHMARKS.md, issue time)
        stream = self.stream
        previous = torch._C._cuda_getCurrentStream(stream.device_index)  # (id, index, type)
        torch._C._cuda_setStream(stream.stream_id, stream.device_index, stream.device_type)
        try:
            work()
        finally:
            torch._C._cuda_setStream(*previous)

    def new_event(self, *, external: bool = False) -> CudaEvent:
        return CudaEvent(self.api, self.timeout_s, external=external)

    def record(self, event: CudaEvent) -> None:
        event.record(self.handle)

    def wait_event(self, event: CudaEvent) -> None:
        if event.handle:
            self.api.wait(self.handle, event.handle)

    def synchronize(self) -> None:
        """Block until the stream's work is done, at most the collective timeout."""
        done = self.new_event()
        self.record(done)
        done.wait()

    def close(self) -> None:
        pass
