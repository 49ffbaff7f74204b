"""CUDA graphs of a transfer's copies and exchanges, one per transfer shape.

Issuing a transfer stage by stage costs the host tens of microseconds per step (a kernel launch
or DMA, an NCCL call, event records), milliseconds for a model's layers. With io_backend=kernel
every step's work depends only on the transfer's page count: the page ids are read from index
tensors on the device. So the first transfer of a page count is captured once, with its index
tensors as static buffers, and every later one copies its page ids into those buffers and
replays the graph: one launch instead of hundreds of calls.

What a graph needs to stay equal to the eager issue:
- Broadcasts go through the staging buffer (an in-place broadcast would bake in device pages).
- Per-layer events are recorded as external graph nodes, so a consumer can wait for layer 0
  while later layers are still moving. They belong to the graph and are re-recorded by every
  replay, so a late wait on an older transfer's layer waits for a newer one: later, never early.
- The graph runs on the transfer stream after whatever was issued on the exchange stream, so
  its broadcasts stay ordered with every other broadcast of the transfer group.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.core.plan import Direction
from pipeline.engine.cuda.streams import CudaEvent, CudaStream, follow
from pipeline.engine.transfer import Pipeline
from pipeline.engine.transfer.state import Tally, Transfer

GraphKey = tuple[int, bool, int]
"""(id of the stage lists, a load, page count): everything a captured transfer's work depends
on. By identity: hashing the frozen stage lists and the direction are Python calls on every
transfer; the capture holds its stage lists, so their id is not reused while it is kept."""


@dataclass
class CapturedTransfer:
    """One captured transfer shape: its graph and the buffers a replay refills."""

    pipeline: Pipeline
    """The stage lists captured (held, so the key's id stays theirs)."""
    graph: torch.cuda.CUDAGraph
    page_ids: torch.Tensor
    """Static buffer [2, pages] the graph reads the host (row 0) and device page ids from."""
    layer_events: dict[int, CudaEvent]
    """Recorded inside the graph (external nodes): per layer, usable after it."""
    ops: list[tuple[str, dict[str, Any]]]
    """The trace ops the capture issued, logged again at every replay."""
    tally: Tally
    """Their counts and bytes, added in one step at every replay."""
    replayed: CudaEvent
    """Recorded after the latest replay: the graph may be released once it completes (cudart's
    own event: torch's costs the issue path more)."""


class TransferGraphs:
    """At most `capacity` captured transfers, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._captured: OrderedDict[GraphKey, CapturedTransfer] = OrderedDict()
        self._retired: list[CapturedTransfer] = []
        """Evicted graphs whose last replay may still run (released once it is done: releasing
        returns the graph's memory to the allocator)."""
        self.captures = 0
        """Transfers captured so far (the rest were replays)."""

    def __len__(self) -> int:
        return len(self._captured)

    def issue(
        self,
        pipeline: Pipeline,
        t: Transfer,
        stream: CudaStream,
        exchange: CudaStream,
        body: Callable[[Transfer], None],
    ) -> None:
        """Issue `body` (`pipeline`'s steps and exchanges, after `prepare` ran) on `stream` as
        a graph replay, capturing it first if this shape is new."""
        assert t.plan.graphed, "a graphed transfer is planned as one (no in-place exchange)"
        key = (id(pipeline), t.plan.direction is Direction.load, t.plan.num_pages)
        if exchange is not stream:
            follow(stream, exchange)
        self._release_retired()
        captured = self._captured.get(key)
        refill = captured is not None
        if captured is None:
            captured = self._capture(pipeline, t, stream, body)
            self._captured[key] = captured
            while len(self._captured) > self.capacity:
                self._retired.append(self._captured.popitem(last=False)[1])
        else:
            self._captured.move_to_end(key)
            t.res.trace.replay(captured.ops, captured.tally)

        def replay() -> None:
            if refill:  # this transfer's page ids into the graph's static buffer, one copy
                t.res.upload(t.page_id_rows(), captured.page_ids)
            captured.graph.replay()

        stream.submit(replay)  # the stream switch of the issue path (see `CudaStream.submit`)
        stream.record(captured.replayed)
        t.layer_events.update(captured.layer_events)

    def _capture(
        self, pipeline: Pipeline, t: Transfer, stream: CudaStream, body: Callable[[Transfer], None]
    ) -> CapturedTransfer:
        """Capture `body` with static page ids and external layer events (runs nothing)."""
        with torch.cuda.stream(stream.stream):  # this transfer's ids, in place for the replay
            ids = t.res.upload(t.page_id_rows(), None)
        t.host_ids, t.device_ids = ids[0], ids[1]
        layout = t.plan.layout
        layer_events = layout.layer_events(lambda: stream.new_event(external=True))
        t.layer_events = dict(layer_events)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream.stream), t.res.trace.capture() as ops:
            # thread_local: other threads may keep using CUDA while this one captures
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                body(t)
            except BaseException:
                with contextlib.suppress(Exception):  # the body's error is the one to see
                    graph.capture_end()
                raise
            graph.capture_end()
        self.captures += 1
        return CapturedTransfer(
            pipeline,
            graph,
            ids,
            layer_events,
            ops,
            Tally.of(ops),
            stream.new_event(),
        )

    def _release_retired(self) -> None:
        still_running = []
        for captured in self._retired:
            if captured.replayed.query():
                captured.graph.reset()
            else:
                still_running.append(captured)
        self._retired = still_running

    def clear(self) -> None:
        """Release every graph once the device is done with it (on teardown: this syncs;
        before the process groups the graphs broadcast on are destroyed)."""
        torch.cuda.synchronize()
        for captured in (*self._captured.values(), *self._retired):
            captured.graph.reset()
        self._captured.clear()
        self._retired.clear()
