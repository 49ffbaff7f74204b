"""Per rank: the device, process groups and streams a transfer runs on.

`Runtime.start` is the one place that creates process groups (`groups.make_groups`); it runs
before any pool is allocated, so the transfer group exists before host memory is pinned. The
engine's ranks are the TP ranks of one attention-TP group: the caller's `group`, or the whole
default group. Its own groups are made by those ranks alone, so engines sharing a world never
wait on each other, and `close` shuts them down and lets go of them.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.core.model import ModelGeometry
from pipeline.core.topology import Backend, DeviceKind, Topology
from pipeline.engine.comms import Group
from pipeline.engine.cuda.cudart import Cudart, cuda_runtime
from pipeline.engine.cuda.memcpy import (
    CopyPages,
    Upload,
    copy_pages_cpu,
    cuda_copier,
    cuda_uploader,
    upload_cpu,
)
from pipeline.engine.cuda.memcpy_batch import CopyStacks, cpu_stack_copier, cuda_stack_copier
from pipeline.engine.cuda.page_kernel import MovePages, PageKernel, move_pages_cpu
from pipeline.engine.cuda.streams import CudaStream, InlineStream, Stream, WorkerStream
from pipeline.engine.groups import engine_ranks, make_groups
from pipeline.engine.poll_notes import PollNotes


class GroupCollectives:
    """The collectives of one process group (a replica group's transfer group), by TP rank.
    On CPU a wait that a peer's skipped poll keeps from completing says so (`PollNotes`);
    a CUDA collective is only enqueued here, so its wait is the event's."""

    def __init__(self, group: Group | None, members: tuple[int, ...], notes: PollNotes) -> None:
        self.group = group
        """None where the replica group has one rank: nothing is ever exchanged there."""
        self.members = members
        """The replica group's TP ranks, in group order."""
        self.notes = notes

    def _group(self) -> Group:
        assert self.group is not None, "a replica group of one rank exchanges nothing"
        return self.group

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Broadcast from TP rank `src`."""
        stuck = None if tensor.is_cuda else self.notes.stuck(f"a broadcast from rank {src}")
        self._group().broadcast(tensor, self.members.index(src), stuck)

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor) -> None:
        stuck = None if tensor.is_cuda else self.notes.stuck("a load's verify")
        self._group().all_gather(out, tensor, stuck)


def pick_device(kind: DeviceKind, local_rank: int) -> torch.device:
    if kind is DeviceKind.cuda or (kind is DeviceKind.auto and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("topology.device=cuda but CUDA is not available; use device=cpu")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def pick_backend(backend: Backend, device: torch.device) -> str:
    if backend is Backend.auto:
        return "nccl" if device.type == "cuda" else "gloo"
    if backend is Backend.nccl and device.type != "cuda":
        raise ValueError("runtime.backend=nccl needs cuda devices; use gloo or auto")
    return backend.value


@dataclass
class Runtime:
    """One rank's device, groups and streams."""

    rank: int
    """This rank's TP rank: its rank in the engine's group (topology math reads it)."""
    global_ranks: tuple[int, ...]
    """The global rank of each TP rank, in TP order (torch's src= and dst= take these)."""
    device: torch.device
    replica_group: tuple[int, ...]
    """TP ranks holding the same bytes as this rank."""
    transfer_group: Group | None
    """Dedicated group of the replica group for broadcasts (None when it has one rank)."""
    cpu_group: Group
    """Gloo group of the engine's ranks for host-side agreement (ack polls, reports): the
    caller's, or one the engine made."""
    l3_group: Group
    """Gloo group of the engine's ranks for the L3 write-back thread (rotating owners send
    their layers to the object's writer there), so it never interleaves with `cpu_group`'s."""
    load_stream: Stream
    write_stream: Stream
    exchange_stream: Stream
    """Where gated exchanges (gather, broadcast, scatter) run, behind each layer's copy."""
    gather_stream: Stream
    """Where a chunked backup gathers its next batch while the write stream moves one (at the
    highest priority on cuda)."""
    forward_stream: Stream
    """Stands in for the serving engine's forward stream (the consumer of loads)."""
    timeout_s: float
    copy_pages: CopyPages
    """One copy call per run of pages (a strided DMA on cuda)."""
    copy_stacks: CopyStacks
    """One copy call per run of pages of every stacked unit (a batch of DMAs on cuda)."""
    move_pages: MovePages
    """Gathers and scatters pages by their ids (one kernel on cuda: `page_kernel`)."""
    upload: Upload
    """Puts a transfer's page ids on the device (one raw async copy on cuda)."""
    notes: PollNotes
    """Where this rank's polls wait, and its peers' (`poll_notes`)."""
    groups: tuple[Group, ...] = ()
    """Every group `start` made, closed by `close` (each holds sockets and threads); never
    the caller's."""

    def __post_init__(self) -> None:
        # A group's threads must end before the interpreter finalizes: a gloo thread that
        # frees a collective's tensors once it has begun takes the GIL there, and the process
        # aborts. So they end at `close`, or as the runtime is collected, or else at exit
        # (atexit runs before the interpreter finalizes).
        self._close_groups = weakref.finalize(self, close_groups, self.groups)

    @classmethod
    def start(
        cls,
        topology: Topology,
        model: ModelGeometry,
        *,
        group: dist.ProcessGroup | None,
        cpu_group: dist.ProcessGroup | None,
        device: torch.device,
        backend: str,
        timeout_s: float,
    ) -> Runtime:
        """Create the engine's groups over `group`'s ranks (None: the default group's), each
        made by those ranks alone, once all of them have come (RuntimeError naming those that
        did not within `timeout_s`); `cpu_group`: the caller's gloo group over the same
        ranks, used instead of making one."""
        ranks = engine_ranks(topology, group, cpu_group)
        rank = ranks.index(dist.get_rank())
        replica = topology.replica_group(rank, model)
        made = make_groups(
            ranks,
            replica,
            cpu_group=cpu_group,
            device=device,
            backend=backend,
            timeout_s=timeout_s,
        )
        cudart = cuda_runtime(device)  # None on CPU
        copy = copy_pages_cpu if cudart is None else cuda_copier(cudart, device.index)
        stacks = (  # a CPU rank copies on torch's intra-op threads, as its tensor ops run
            cpu_stack_copier(torch.get_num_threads())
            if cudart is None
            else cuda_stack_copier(cudart, device.index)
        )
        move = move_pages_cpu if cudart is None else PageKernel(cudart, device)
        upload = upload_cpu if cudart is None else cuda_uploader(cudart, device)
        load, write, exchange, gather, forward = _streams(device, rank, timeout_s, cudart)
        return cls(
            *(rank, ranks, device, replica, made.transfer, made.cpu, made.l3),
            *(load, write, exchange, gather, forward),
            timeout_s=timeout_s,
            copy_pages=copy,
            copy_stacks=stacks,
            move_pages=move,
            upload=upload,
            notes=PollNotes(made.store, made.prefix, rank, len(ranks), timeout_s),
            groups=made.made,
        )

    @property
    def world_size(self) -> int:
        """The engine's TP ranks."""
        return len(self.global_ranks)

    def global_rank(self, tp_rank: int) -> int:
        return self.global_ranks[tp_rank]

    @property
    def collectives(self) -> GroupCollectives:
        """The transfer group's collectives."""
        return GroupCollectives(self.transfer_group, self.replica_group, self.notes)

    @property
    def streams(self) -> tuple[Stream, ...]:
        return (
            self.load_stream,
            self.write_stream,
            self.exchange_stream,
            self.gather_stream,
            self.forward_stream,
        )

    def close(self) -> None:
        """Stop the streams, then shut down the groups this runtime made and let go of them
        (never the caller's `group`, `cpu_group` or default group): an engine made and closed
        again and again keeps no sockets open, and no group's threads outlive `close` into
        the interpreter's exit."""
        for stream in self.streams:
            stream.close()
        self._close_groups()
        self.groups = ()


def close_groups(groups: Sequence[Group]) -> None:
    """Close `groups` (the runtime's finalizer: it holds no reference to the runtime)."""
    for group in groups:
        group.close()


def _streams(
    device: torch.device, rank: int, timeout_s: float, cudart: ctypes.CDLL | None
) -> tuple[Stream, Stream, Stream, Stream, Stream]:
    """(load, write, exchange, gather, forward) streams: CUDA streams on cuda (the forward is
    the current stream; their events are `cudart`'s), worker threads on CPU (the forward is
    the caller's thread). Their events wait at most `timeout_s`."""
    if cudart is None:
        names = ("load", "write", "exchange", "gather")
        workers = [WorkerStream(f"{name}-{rank}", timeout_s) for name in names]
        return workers[0], workers[1], workers[2], workers[3], InlineStream(timeout_s)
    api = Cudart(cudart)
    cuda = [CudaStream(torch.cuda.Stream(device), timeout_s, api) for _ in range(3)]
    # A batch gather runs beside the long, PCIe-bound move of the batch before: at the same
    # priority it starts only as that move ends, and the next move waits for it (see README,
    # Chunked backups)
    highest = torch.cuda.Stream.priority_range()[1]  # type: ignore[call-arg]  # static
    gather = CudaStream(torch.cuda.Stream(device, priority=highest), timeout_s, api)
    forward = CudaStream(torch.cuda.current_stream(device), timeout_s, api)
    return cuda[0], cuda[1], cuda[2], gather, forward
