"""What a stage sees: the engine's resources and one transfer's state.

`Resources` live as long as the engine (pools, buffers, collectives, trace); a `Transfer` is one
backup or load on this rank (its plan, its events, its page ids on the device). The two kinds of
stage that take them are the package's (`pipeline.engine.transfer`). A stage imports this
module, the `cuda` room and the core layer, nothing else of the engine (the L3 tier's stages,
`on_objects`, take the tier's own objects from `pipeline.engine.l3`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from pipeline.core.model import Unit, by_pool_kind
from pipeline.core.plan import Direction, PlanSpec, TransferPlan
from pipeline.core.steps import Step
from pipeline.engine.cuda.memcpy import CopyPages, Upload
from pipeline.engine.cuda.memcpy_batch import CopyStacks
from pipeline.engine.cuda.page_ids import PageIdBuffers
from pipeline.engine.cuda.page_kernel import MovePages
from pipeline.engine.cuda.streams import Event, Stream
from pipeline.engine.transfer.batches import BatchRing
from pipeline.engine.transfer.pools import DevicePool, HostPool


class Collectives(Protocol):
    """The replica group's collectives: a process group's, or a fake one in unit tests."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Send `tensor` from global rank `src` to every member, in place."""

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """Every member's `tensor`, in group order, into `out`."""


class Trace:
    """What a rank issued: counts and bytes per op kind, always (a fixed few numbers), and each
    op in order only when asked (`keep_ops`: tests and `runtime.trace_file` compare them field
    by field; kept always, they would grow with every transfer). Thread-safe."""

    def __init__(self, *, keep_ops: bool = False) -> None:
        self.keep_ops = keep_ops
        self.ops: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        """Ops per kind."""
        self.bytes: dict[tuple[str, str], int] = {}
        """Bytes per (kind, side): copies by direction, broadcasts sent or received."""
        self._captures: list[list[tuple[str, dict[str, Any]]]] = []
        self._lock = threading.Lock()

    def op(self, kind: str, **fields: Any) -> None:
        self.count(kind, side_of(kind, fields), fields.get("bytes", 0), fields)

    def repeat(self, kind: str, times: int, **fields: Any) -> None:
        """`op` `times` over with the same fields: one count where no op is kept (a streamed
        load's reads, a run of pages a group: an op each held Python's lock a while)."""
        if self.keep_ops or self._captures:
            for _ in range(times):
                self.op(kind, **fields)
        elif times:
            nbytes = fields.get("bytes", 0) * times
            self.count(kind, side_of(kind, fields), nbytes, times=times)

    def count(
        self,
        kind: str,
        side: str,
        nbytes: int,
        fields: dict[str, Any] | None = None,
        *,
        times: int = 1,
    ) -> None:
        """`op` with its side and bytes given: a copy's direction and bytes alone is what the
        issue path logs where ops are not kept (no keyword dict, no side lookup); `times` ops
        of `nbytes` in all at once, where ops are not kept (a step's copy calls)."""
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + times
            self.bytes[kind, side] = self.bytes.get((kind, side), 0) + nbytes
            if self.keep_ops or self._captures:
                fields = {"direction": side, "bytes": nbytes} if fields is None else fields
                if self.keep_ops:
                    self.ops.append({"op": kind, **fields})
                for capture in self._captures:
                    capture.append((kind, fields))

    def totals(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """(ops per kind, bytes per kind and side) as of now (other threads add to them)."""
        with self._lock:
            return dict(self.counts), dict(self.bytes)

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        """The ops of a block, to be `replay`ed (a CUDA graph's, logged again per replay)."""
        ops: list[tuple[str, dict[str, Any]]] = []
        self._captures.append(ops)
        try:
            yield ops
        finally:
            self._captures.remove(ops)

    def replay(self, ops: list[tuple[str, dict[str, Any]]], tally: Tally) -> None:
        """Log captured ops again: their tally in one step (a replay is on the issue path),
        and each op only where every op is kept."""
        with self._lock:
            self._add(tally)
            if self.keep_ops:
                self.ops.extend({"op": kind, **fields} for kind, fields in ops)

    def _add(self, tally: Tally) -> None:
        for kind, n in tally.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        for key, n in tally.bytes.items():
            self.bytes[key] = self.bytes.get(key, 0) + n


@dataclass(frozen=True)
class Tally:
    """Counts and bytes of some ops (what `Trace` keeps of them always)."""

    counts: dict[str, int]
    bytes: dict[tuple[str, str], int]
    """Per (kind, side): copies by direction, broadcasts sent or received."""

    @classmethod
    def of(cls, ops: list[tuple[str, dict[str, Any]]]) -> Tally:
        counts: dict[str, int] = {}
        moved: dict[tuple[str, str], int] = {}
        for kind, fields in ops:
            key = (kind, side_of(kind, fields))
            counts[kind] = counts.get(kind, 0) + 1
            moved[key] = moved.get(key, 0) + fields.get("bytes", 0)
        return cls(counts, moved)


def side_of(kind: str, fields: dict[str, Any]) -> str:
    """Which way an op's bytes went: a copy's direction, a broadcast sent or received."""
    if kind == "broadcast":
        return "sent" if fields["sent"] else "received"
    return str(fields.get("direction", ""))


Route = Callable[["Transfer", Step, bool], None]
"""route(t, step, load): one step's copy calls."""


@dataclass(frozen=True)
class Resources:
    """What every transfer of one engine uses (made once, with the engine)."""

    device: torch.device
    device_pool: DevicePool
    host_pool: HostPool
    host_view: HostPool
    """The host pool as the device addresses it: the pool itself on CPU, a UVA alias on cuda."""
    collectives: Collectives
    """Of this rank's replica group (used only where the group has several ranks)."""
    copy_pages: CopyPages
    """Copies one run of pages between two page-wise views (see `pipeline.engine.cuda.memcpy`)."""
    copy_stacks: CopyStacks
    """Copies one run of pages of every unit of two stacks (`pipeline.engine.cuda.memcpy_batch`)."""
    move_pages: MovePages
    """Gathers and scatters pages by their ids (see `pipeline.engine.cuda.page_kernel`)."""
    upload: Upload
    page_id_buffers: PageIdBuffers | None
    """Device buffers lent to transfers for their page ids (see `pipeline.engine.cuda.page_ids`;
    None on CPU, where the plan's own array serves, uncopied)."""
    """Puts page ids on the device (see `pipeline.engine.cuda.memcpy`)."""
    staging: torch.Tensor
    """Flat byte buffer a load's exchanges gather into and broadcast from."""
    batch_buffers: torch.Tensor
    """Two device buffers [2, bytes] a chunked backup gathers its batches into, in turn."""
    gather_stream: Stream
    """Where a chunked backup gathers its batches (the highest priority on cuda)."""
    trace: Trace
    timings_s: dict[str, float]
    """Seconds spent in each stage over all transfers (issue time on cuda)."""
    copy_routes: dict[bool, dict[int, tuple[tuple[Unit, ...], Route]]] = field(
        default_factory=lambda: {False: {}, True: {}}
    )
    """The copy stage's calls for a step of several units, as DMAs or not, then by the units
    tuple (`remembered`; `stages.copy._route`)."""

    def fitted(self, spec: PlanSpec) -> PlanSpec:
        """`spec` for these pools: whether both keep each pool kind's copied units evenly
        spaced in one buffer (adopted KV of one tensor per layer does not)."""
        copied = tuple(u for u in spec.units if spec.copies(u))
        stack = all(
            self.host_view.stacked(kind) is not None and self.device_pool.stacked(kind) is not None
            for kind in by_pool_kind(copied)
            if len(kind) > 1
        )
        return dataclasses.replace(spec, pools_stack=stack)


@dataclass(eq=False)
class Transfer:
    """One backup or load on this rank: its plan, the engine's resources, its events."""

    plan: TransferPlan
    res: Resources
    layer_events: dict[int, Event]
    """Per model layer of a load: completes once the layer is usable on this rank; made by the
    engine, or owned by the CUDA graph that records them."""
    done: Event
    """Completes once the whole transfer is done on this rank (the ack)."""
    all_copied: Event
    """Every copy of the transfer is done."""
    copied: dict[int, Event] = field(default_factory=dict)
    """Per model layer, its copies are done (made where an exchange waits for them)."""
    batches: BatchRing | None = None
    """A chunked backup's batch buffers in turn (backups with gathered steps only)."""
    error: BaseException | None = None
    """Why the transfer failed; its events carry it, and its remaining stages are skipped."""
    on_fail: Callable[[Transfer, BaseException], None] | None = None
    """Told once when the transfer fails (the engine decides whether it stays usable)."""
    host_ids: torch.Tensor | None = None
    """Local host page ids on the device (see `page_ids`)."""
    device_ids: torch.Tensor | None = None
    """Local device page ids on the device (see `page_ids`)."""
    _ids_of: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _exchange: dict[tuple[int, int], tuple[torch.Tensor, bool]] = field(default_factory=dict)

    @property
    def layers(self) -> tuple[int, ...]:
        """Model layers a load makes usable one by one, in order (none for a backup)."""
        return () if self.plan.direction is Direction.backup else self.plan.layout.layers

    def fail(self, error: BaseException) -> None:
        """Fail this transfer once: every pending event completes with `error` (its waiters
        raise it), and `on_fail` hears of it."""
        if self.error is not None:
            return
        self.error = error
        events = (*self.layer_events.values(), *self.copied.values(), self.all_copied, self.done)
        for event in events:
            event.fail(error)
        if self.on_fail is not None:
            self.on_fail(self, error)

    def page_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(host page ids, device page ids) on the pool's device, moved there on first use by
        one non-blocking copy on the current stream (the plan's ids are already local), into
        a buffer the engine lends (or a new one, where every buffer is still in use)."""
        if self.host_ids is None or self.device_ids is None:
            rows, buffers = self.page_id_rows(), self.res.page_id_buffers
            lent = None if buffers is None else buffers.lend(self, rows.shape[1])
            if lent is None:
                on_device = self.res.upload(rows, None)
                self.host_ids, self.device_ids = on_device[0], on_device[1]
            else:
                both, self.host_ids, self.device_ids = lent
                self.res.upload(rows, both)
        return self.host_ids, self.device_ids

    def page_id_rows(self) -> np.ndarray:
        """The plan's [host pages, device pages], for one upload."""
        return self.plan.page_rows

    def step_ids(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The page ids of a step's slice (sliced once per slice: one serves every unit)."""
        key = (step.first, step.count)
        if key not in self._ids_of:
            host, device = self.page_ids()
            if step.count < self.plan.num_pages:  # else the ids themselves, not a slice
                pages = slice(step.first, step.first + step.count)
                host, device = host[pages], device[pages]
            self._ids_of[key] = (host, device)
        return self._ids_of[key]

    def exchange_buffer(self, step: Step) -> tuple[torch.Tensor, bool]:
        """(what a step's broadcast moves, whether gather/scatter must fill it): the device
        slots themselves where the plan lands it in place, else the staging buffer."""
        key = (step.unit.ordinal, step.first)
        if key not in self._exchange:
            layer = self.res.device_pool.layer(step.unit)
            first = self.plan.in_place(step)
            if first is not None:
                self._exchange[key] = (layer[first : first + step.count], False)
            else:
                nbytes = step.count * step.unit.page_bytes
                assert nbytes <= self.res.staging.numel(), "the plan sizes slices to staging"
                staged = self.res.staging[:nbytes].view(layer.dtype)
                self._exchange[key] = (staged.view(step.count, *layer.shape[1:]), True)
        return self._exchange[key]
