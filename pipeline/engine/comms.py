"""One process group of an engine, called through its own methods.

The groups an engine makes are built from torch's public constructors (`ProcessGroupGloo`,
`ProcessGroupNCCL`) on store prefixes the engine names itself (`groups.make_groups`), so no
rank's count of groups enters a name. torch does not register such a group, so
`torch.distributed`'s functions, which look a group up to translate ranks, refuse it: a
`Group` calls the group's own collectives instead, with group ranks, exactly as those
functions do (`dist.broadcast` is `group.broadcast([tensor], opts)`, then a wait on the work
it returns, where it returns one). The caller's `cpu_group` is wrapped the same way, and is
never shut down.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions

Stuck = Callable[[float], None]
"""Called while a collective is still waiting, with the seconds it has waited; may raise."""


class Comm(Protocol):
    """What an engine calls on a c10d ProcessGroup or Backend (both have these methods)."""

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def broadcast(
        self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions
    ) -> dist.Work | None: ...

    def allgather(
        self,
        output_tensors: list[list[torch.Tensor]],
        input_tensors: list[torch.Tensor],
        opts: AllgatherOptions,
    ) -> dist.Work | None: ...

    def barrier(self, opts: dist.BarrierOptions) -> dist.Work | None: ...

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work | None: ...

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work | None: ...

    def shutdown(self) -> None: ...


class Group:
    """A process group of an engine's ranks: its collectives by group rank, and `close`."""

    def __init__(self, comm: Comm, ranks: tuple[int, ...], *, made: bool, timeout_s: float) -> None:
        self._comm: Comm | None = comm
        self.ranks = ranks
        """The global rank of each group rank."""
        self.rank, self.size = comm.rank(), comm.size()
        self.made = made
        """Made by the engine (closed with it), not the caller's."""
        self.grace_s = timeout_s / 8
        """How often a collective that takes a `stuck` callback calls it while it waits (an
        eighth of the engine's timeout: a poll that long is seen, and rarely)."""

    @classmethod
    def theirs(cls, group: dist.ProcessGroup, timeout_s: float) -> Group:
        """The caller's (registered) group, which `close` leaves alone (`timeout_s`: the
        engine's, which paces its waits; the group keeps its own timeout)."""
        ranks = tuple(dist.get_process_group_ranks(group))
        return cls(group, ranks, made=False, timeout_s=timeout_s)

    @property
    def comm(self) -> Comm:
        if self._comm is None:
            raise RuntimeError(f"the engine's group of ranks {list(self.ranks)} is closed")
        return self._comm

    def broadcast(self, tensor: torch.Tensor, src: int, stuck: Stuck | None = None) -> None:
        """`tensor` from group rank `src` to every member, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.asyncOp = src, 0, False
        self._wait(self.comm.broadcast([tensor], opts), stuck)

    def all_gather(
        self, out: list[torch.Tensor], tensor: torch.Tensor, stuck: Stuck | None = None
    ) -> None:
        """Every member's `tensor`, in group order, into `out`."""
        opts = AllgatherOptions()  # torch.distributed does not re-export it
        opts.asyncOp = False
        self._wait(self.comm.allgather([out], [tensor], opts), stuck)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every member's picklable `obj`, in group order (as `dist.all_gather_object`: its
        length, then its bytes padded to the longest)."""
        if self.size == 1:  # no member to hear from: the copy a gather hands back, no round
            return [pickle.loads(pickle.dumps(obj))]
        mine = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self.all_gather(lengths, torch.tensor([mine.numel()], dtype=torch.int64))
        longest = max(int(n.item()) for n in lengths)
        rows = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.size)]
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: mine.numel()] = mine
        self.all_gather(rows, padded)
        return [
            pickle.loads(row[: int(n.item())].numpy().tobytes())
            for row, n in zip(rows, lengths, strict=True)
        ]

    def barrier(self) -> None:
        opts = dist.BarrierOptions()
        opts.asyncOp = False
        self._wait(self.comm.barrier(opts), None)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """`tensor` to group rank `dst` (its `recv`)."""
        self._wait(self.comm.send([tensor], dst, 0), None)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Group rank `src`'s `send`, into `tensor`."""
        self._wait(self.comm.recv([tensor], src, 0), None)

    def close(self) -> None:
        """Shut a group the engine made down and let go of it (its threads and sockets end
        with it, here rather than at interpreter exit); the caller's stays as it was."""
        comm, self._comm = self._comm, None
        if comm is not None and self.made:
            comm.shutdown()

    def _wait(self, work: dist.Work | None, stuck: Stuck | None) -> None:
        """Wait for `work`; with `stuck`, in steps of `grace_s`, calling it after each step
        the work has not finished (the group's own timeout still ends the wait). No work:
        the op is ordered already (NCCL's, not async, runs on the current stream)."""
        if work is None:
            return
        if stuck is None:
            work.wait()
            return
        waited = 0.0
        while True:
            try:
                work.wait(timedelta(seconds=self.grace_s))
                return
            except RuntimeError:
                if work.is_completed():  # failed, not only waiting: raise what it raised
                    raise
            waited += self.grace_s
            stuck(waited)
