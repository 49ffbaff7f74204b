"""An ordering model: can a load's broadcasts deadlock against the forward's collectives?

Each rank runs two streams (load, forward) of ops: collectives on a communicator, and event
records/waits between streams. The model is NCCL's conservative contract: a rank's GPU makes
progress on one collective at a time, and a collective completes only once every member has
started the same one (the same position on that communicator). Which stream a rank launches
next is up to the scheduler, so the checker explores every interleaving (memoized DFS) and
reports a reachable state where nothing can move: a deadlock, with the path that reaches it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Literal

DESIGNS = ("none", "gate", "forward_stream")
"""none: no ordering safety; gate: the forward waits for the whole exchange; forward_stream:
the exchange of layer i is issued on the forward stream before layer i's collective."""


@dataclass(frozen=True)
class Op:
    """One op of one stream: a collective, or an event record or wait between streams."""

    kind: Literal["collective", "record", "wait"]
    name: str
    """Communicator (collectives) or event name (records, waits)."""
    label: str = ""
    """What the op is, for witnesses (e.g. 'broadcast layer 3')."""
    position: int = 0
    """A collective's place among its stream's collectives on the same communicator
    (numbered by `check`)."""


Program = tuple[tuple[tuple[Op, ...], ...], ...]
"""Per rank, per stream (0: load, 1: forward), the ops in stream order."""
STREAMS = ("load", "forward")


def scenario(design: str, broadcasts_per_layer: list[int], num_ranks: int) -> Program:
    """One sharded load followed by a forward with one TP all-reduce per layer, per rank."""
    if design not in DESIGNS:
        raise ValueError(f"unknown ordering design {design!r}; choose from {DESIGNS}")
    bcasts = [
        [Op("collective", "transfer", f"broadcast layer {layer} part {k}") for k in range(n)]
        for layer, n in enumerate(broadcasts_per_layer)
    ]
    allreduce = [
        Op("collective", "forward", f"all-reduce layer {layer}")
        for layer in range(len(broadcasts_per_layer))
    ]
    if design == "none":
        load = [op for layer in bcasts for op in layer]
        forward = allreduce
    elif design == "gate":
        load = [*(op for layer in bcasts for op in layer), Op("record", "exchange done")]
        forward = [Op("wait", "exchange done", "forward gate"), *allreduce]
    else:
        load = [Op("record", f"copied {layer}") for layer in range(len(bcasts))]
        forward = [
            op
            for layer, ops in enumerate(bcasts)
            for op in (Op("wait", f"copied {layer}"), *ops, allreduce[layer])
        ]
    program = (tuple(load), tuple(forward))
    return tuple(program for _ in range(num_ranks))


@dataclass(frozen=True)
class Finding:
    """What the search found for one design."""

    deadlock: bool
    states: int
    """States explored."""
    witness: tuple[str, ...]
    """A deadlocked state, one line per blocked rank (empty when none)."""


MAX_STATES = 200_000
"""The search budget: a few seconds of exploring (the shipped topologies need under 1000)."""
MAX_WORK = 10_000_000
"""The same budget in work: a state costs its ranks times one plus a 64th of a rank's
longest stream (each rank's position and records are hashed and copied per state; measured
on a 2-core machine, 1 to 1.5 us per unit), so many ranks or many layers stop at fewer
states (16 ranks of 4096 layers ran over 5 minutes within 200000 states, 1024 ranks of 4096
layers 40 ms a state)."""


def check(program: Program, max_states: int = MAX_STATES) -> Finding:
    """Search every interleaving for a state where no rank can move but work remains."""
    longest = max(len(ops) for streams in program for ops in streams)
    if len(program) * longest > MAX_WORK // 4:  # even its first states would cost seconds
        raise ValueError(
            f"the ordering model of {len(program)} ranks with {longest} ops a stream is "
            "beyond its budget: check a smaller case (fewer layers, model.num_layers, or "
            "ranks, topology.tp_size)"
        )
    max_states = min(max_states, MAX_WORK // (len(program) * (1 + longest // 64)))
    program = tuple(tuple(_numbered(ops) for ops in streams) for streams in program)
    ranks = range(len(program))
    start: State = (
        tuple((0,) * len(streams) for streams in program),
        (None,) * len(program),
        tuple(frozenset() for _ in ranks),
    )
    start = _settle(program, start)
    seen = {start}
    queue = deque([start])  # breadth first: the witness is a shortest path to the deadlock
    while queue:
        state = queue.popleft()
        moves = _moves(program, state)
        if not moves:
            pcs = state[0]
            if any(pc < len(s) for r in ranks for pc, s in zip(pcs[r], program[r], strict=True)):
                return Finding(True, len(seen), _describe(program, state))
            continue
        for nxt in moves:
            if nxt not in seen:
                if len(seen) >= max_states:
                    raise _over_budget(program, max_states)
                seen.add(nxt)
                queue.append(nxt)
    return Finding(False, len(seen), ())


def _over_budget(program: Program, max_states: int) -> ValueError:
    return ValueError(
        f"the ordering model of {len(program)} ranks exceeded its budget of {max_states} "
        "states: check a smaller case (fewer layers, model.num_layers, or ranks, "
        "topology.tp_size)"
    )


State = tuple[tuple[tuple[int, ...], ...], tuple[int | None, ...], tuple[frozenset, ...]]


def _moves(program: Program, state: State) -> list[State]:
    """Successors: each collective the first idle rank with a choice can start.

    Two reductions keep the search small and hide no deadlock. Records and waits are taken
    eagerly (`_settle`): they never conflict and stay enabled once enabled. And only one idle
    rank branches: nothing other ranks do changes an idle rank's options, so any deadlock
    reachable at all is reachable with that rank's move first (a persistent set).
    """
    pcs, active, recorded = state
    for r, streams in enumerate(program):
        starts = [
            s
            for s, ops in enumerate(streams)
            if active[r] is None and pcs[r][s] < len(ops) and ops[pcs[r][s]].kind == "collective"
        ]
        if starts:
            return [_settle(program, (pcs, _set(active, r, s), recorded)) for s in starts]
    return []


def _settle(program: Program, state: State) -> State:
    """Apply every enabled record and wait, and every collective all ranks started (in place
    on lists, then frozen once: a copy per op made a rank's 4096 records quadratic)."""
    while True:
        pcs, active, recorded = _complete(program, state)
        rows, records = [list(row) for row in pcs], [set(done) for done in recorded]
        for r, streams in enumerate(program):
            for s, ops in enumerate(streams):
                while rows[r][s] < len(ops) and active[r] != s:
                    op = ops[rows[r][s]]
                    if op.kind == "record":
                        records[r].add(op.name)
                    elif op.kind != "wait" or op.name not in records[r]:
                        break
                    rows[r][s] += 1
        settled = (
            tuple(map(tuple, rows)),
            active,
            tuple(
                done if len(done) == len(now) else frozenset(now)
                for done, now in zip(recorded, records, strict=True)
            ),
        )
        if settled == state:
            return state
        state = settled


def _complete(program: Program, state: State) -> State:
    """Finish the collective every rank has started, if they all started the same one."""
    pcs, active, recorded = state
    started = {
        (program[r][s][pcs[r][s]].name, program[r][s][pcs[r][s]].position)
        for r, s in enumerate(active)
        if s is not None
    }
    if None in active or len(started) != 1:
        return state
    for r, s in enumerate(active):
        assert s is not None
        pcs = _advance(pcs, r, s)
    return pcs, (None,) * len(active), recorded


def _numbered(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """`ops` with each collective's `position` (counted once, not per state)."""
    seen: dict[str, int] = {}
    found = []
    for op in ops:
        if op.kind == "collective":
            op = dataclasses.replace(op, position=seen.get(op.name, 0))
            seen[op.name] = op.position + 1
        found.append(op)
    return tuple(found)


def _advance(pcs: tuple[tuple[int, ...], ...], r: int, s: int) -> tuple[tuple[int, ...], ...]:
    row = list(pcs[r])
    row[s] += 1
    return _set(pcs, r, tuple(row))


def _set(values: tuple, i: int, value: object) -> tuple:
    return (*values[:i], value, *values[i + 1 :])


def _describe(program: Program, state: State) -> tuple[str, ...]:
    pcs, active, _ = state
    lines = []
    for r, streams in enumerate(program):
        for s, ops in enumerate(streams):
            if pcs[r][s] < len(ops):
                op = ops[pcs[r][s]]
                how = "started" if active[r] == s else "waiting"
                lines.append(f"rank {r} {STREAMS[s]} stream: {how} {op.label or op.name}")
    return tuple(lines)
