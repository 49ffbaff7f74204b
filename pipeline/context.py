"""What a stage sees: the transfer context, the stream it runs on, and the op trace.

Stages import only this module, `pipeline.plan` and `pipeline.topology`. Streams and events are
protocols here; `pipeline.streams` implements them for CUDA and for CPU worker threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pipeline.memcpy import CopyPages
from pipeline.plan import Step, TransferPlan
from pipeline.pools import DevicePool, HostPool


class Event(Protocol):
    """Completion marker recorded on a stream."""

    def wait(self) -> None:
        """Block the calling thread until the event completes; re-raise the stream's error."""

    def query(self) -> bool:
        """Has the event completed?"""

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


class Stage(Protocol):
    """One small step of a pipeline; `step` is None in the prepare and finish lists."""

    def __call__(self, ctx: TransferContext, step: Step | None, stream: Stream) -> None: ...


class Trace:
    """Ops a rank issued, in order, as flat dicts (thread-safe; compared field by field)."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def op(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.ops.append({"op": kind, **fields})

    def total(self, kind: str, key: str = "bytes") -> int:
        return sum(o[key] for o in self.ops if o["op"] == kind)


@dataclass
class TransferContext:
    """Everything one transfer's stages share on one rank."""

    plan: TransferPlan
    device_pool: DevicePool
    host_pool: HostPool
    group: dist.ProcessGroup | None
    """Transfer group of this rank's replica group (None when the group has one rank)."""
    device: torch.device
    trace: Trace
    host_view: HostPool
    """The host pool as the device addresses it: the pool itself on CPU, a UVA alias on cuda."""
    copy_pages: CopyPages
    """Copies one run of pages between two page-wise views (see `pipeline.memcpy`)."""
    staging: torch.Tensor
    """Flat byte buffer for gather/broadcast/scatter (staging_bytes long)."""
    batch_staging: torch.Tensor | None
    """Backups: two device buffers [2, bytes] a chunked backup gathers its batches into."""
    gather_stream: Stream
    """Where a chunked backup gathers its batches (see `stages.copy`)."""
    layers: tuple[int, ...]
    """Model layers a load makes usable one by one (none for a backup)."""
    layer_events: dict[int, Event]
    """Per model layer: completes once the layer is usable on this rank (load); made by the
    executor, or owned by the CUDA graph that records them."""
    done: Event
    """Completes once the whole transfer is done on this rank (the ack)."""
    all_copied: Event
    """Every copy of the transfer is done."""
    ordered: bool
    """The transfer entered through an ordered entry point (forward gate or forward stream)."""
    verify: bool
    """Check across the replica group that every rank loaded the same bytes (`Verify`)."""
    host_pages: torch.Tensor | None = None
    """Local host page ids on `device` (see `page_ids`)."""
    device_pages: torch.Tensor | None = None
    """Local device page ids on `device` (see `page_ids`)."""
    steps: tuple[Step, ...] = ()
    """Steps the executor walks (the plan's; a chunked backup's in batches)."""
    copied: dict[int, Event] = field(default_factory=dict)
    """Per model layer, the layer's copies are issued and done (made where there is an
    exchange to wait for them)."""
    in_graph: bool = False
    """The steps are being captured into a CUDA graph: nothing may depend on page ids."""
    page_slices: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )
    """Page ids per (first, count) slice, made once per transfer (see `step_pages`)."""
    exchange_buffers: dict[tuple[int, int], tuple[torch.Tensor, bool]] = field(default_factory=dict)
    """Per (unit, first page), what the step's broadcast moves (see `exchange_buffer`)."""
    by_layer: dict[int, list[Step]] = field(default_factory=dict)
    """The steps of each model layer (see `layer_steps`)."""
    timings_s: dict[str, float] = field(default_factory=dict)
    """Seconds spent in each stage on this rank (issue time on cuda)."""
    batches_moved: list[Event] = field(default_factory=list)
    """Per batch gathered into `batch_staging`, in order: its copy to the host is done."""

    def fail(self, error: BaseException) -> None:
        """Complete every pending event of this transfer with `error` (its waiters raise)."""
        for event in (
            *self.layer_events.values(),
            *self.copied.values(),
            self.all_copied,
            self.done,
        ):
            event.fail(error)


def layer_steps(ctx: TransferContext, layer: int) -> list[Step]:
    """The steps of one model layer, grouped once per transfer (steps are final after
    `prepare`)."""
    if not ctx.by_layer:
        for step in ctx.steps:
            ctx.by_layer.setdefault(step.unit.layer, []).append(step)
    return ctx.by_layer[layer]


def staging_for(ctx: TransferContext, step: Step) -> torch.Tensor:
    """The staging bytes of one step, viewed as the unit's [pages, rows, elems] on the device."""
    layer = ctx.device_pool.layer(step.unit)
    nbytes = step.count * step.unit.page_bytes
    assert nbytes <= ctx.staging.numel(), "plan slices exchanged units to fit the staging buffer"
    return ctx.staging[:nbytes].view(layer.dtype).view(step.count, *layer.shape[1:])


def page_ids(ctx: TransferContext) -> tuple[torch.Tensor, torch.Tensor]:
    """(host page ids, device page ids) of the transfer on the pool's device, moved there on
    first use by one non-blocking copy on the current stream (the plan's ids are already
    local: see `stages.localize`)."""
    if ctx.host_pages is None or ctx.device_pages is None:
        plan = ctx.plan
        pages = torch.stack([plan.host_pages, plan.device_pages]).to(ctx.device, non_blocking=True)
        ctx.host_pages, ctx.device_pages = pages[0], pages[1]
    return ctx.host_pages, ctx.device_pages


def step_pages(ctx: TransferContext, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """(host page ids, device page ids) of a step's slice, on the pool's device (sliced once
    per slice and transfer: the same slice serves every unit)."""
    key = (step.first, step.count)
    if key not in ctx.page_slices:
        host_pages, device_pages = page_ids(ctx)
        sl = slice(step.first, step.first + step.count)
        ctx.page_slices[key] = (host_pages[sl], device_pages[sl])
    return ctx.page_slices[key]


def exchange_buffer(ctx: TransferContext, step: Step) -> tuple[torch.Tensor, bool]:
    """(what a step's broadcast moves, whether gather/scatter must fill it): the device slots
    themselves when this rank's pages of the step are consecutive, else the staging buffer
    (always inside a graph, which must not bake in page ids)."""
    key = (step.unit.ordinal, step.first)
    if key not in ctx.exchange_buffers:
        layer = ctx.device_pool.layer(step.unit)
        first = None if ctx.in_graph else ctx.plan.device_run(step)
        ctx.exchange_buffers[key] = (
            (layer[first : first + step.count], False)
            if first is not None
            else (staging_for(ctx, step), True)
        )
    return ctx.exchange_buffers[key]
