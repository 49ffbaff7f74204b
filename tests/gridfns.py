"""One case of the API grid, through the public API only: `pipeline.compose`,
`pipeline.create_engine` (in the caller's process group, adopting the caller's KV or not) and
the engine's public calls (`host_slots`, `backup`, `load`, `write_back`, `load_from_l3`).

Shared by the tp1 grid (tests/unit/test_api_grid.py), the tp2 grid on gloo ranks
(tests/distributed/test_api_grid_tp2.py) and the GPU grid (tests/gpu/test_api_grid_gpu.py);
spawned ranks import it by name (tests/ is on sys.path, and spawn hands it on).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

import pipeline
from pipeline.engine.l3.handles import WindowedLoad
from pipeline.engine.transfer.pools import unit_dtype, unit_shape

MODELS = ("tiny_mla", "tiny_dsa", "tiny_mha")
STRATEGIES = ("replicated", "single_source", "rotating")
CHUNK_PAGES = (0, 1, 2, 3)
"""Unchunked, one page a batch, an even and an odd batch size (7 pages: 3 leaves a partial
last batch, and 2 does too)."""
ADOPTED = ("none", "per_layer", "stacked")
STORES = ("none", "file")
PAGES = 7
"""Pages each case moves: source pages 0..6, load target pages 8..14."""
TARGET = 8
DEVICE_PAGES = 16
MAX_POLLS = 1000
"""Polls for an ack whose event has completed on every rank (the first releases it, unless
the ack ledger skips idle polls)."""


@dataclass(frozen=True)
class Case:
    """One point of the grid (strategy: the effective one, after compose's fallback)."""

    model: str
    strategy: str
    chunk_pages: int
    adopted: str
    store: str
    tp: int = 1
    device: str = "cpu"

    def __str__(self) -> str:
        return (
            f"{self.model}-{self.strategy}-chunk{self.chunk_pages}-{self.adopted}-"
            f"{self.store}-tp{self.tp}-{self.device}"
        )

    def overrides(self, store_dir: Path | None = None) -> list[str]:
        """The command line of this case (a file store in `store_dir`)."""
        overrides = [
            f"model={self.model}",
            f"strategy={self.strategy}",
            f"topology=tp{self.tp}",
            f"topology.device={self.device}",
            f"strategy.chunk_pages={self.chunk_pages}",
            f"workload.num_tokens={PAGES * 4}",  # page_size 4 in every tiny model
            f"workload.device_tokens={DEVICE_PAGES * 4}",
        ]
        if self.store == "file":
            overrides += ["storage=file", f"storage.path={store_dir}"]
        return overrides

    def job(self, store_dir: Path | None) -> pipeline.Job:
        """The checked job of this case, whose strategy is the one asked for."""
        overrides = self.overrides(store_dir)
        job = pipeline.compose(overrides)
        assert job.strategy.config.name == self.strategy, (self, job.strategy.config.name)
        return job


def engine_kinds(tp: int) -> list[tuple[str, str]]:
    """(model, effective strategy) pairs at this TP size: at tp1 every strategy falls back to
    replicated, and at tp2 an MHA model's ranks hold different heads, so only replicated
    applies to it (`test_fallbacks_leave_these_engine_kinds` pins both)."""
    if tp == 1:
        return [(model, "replicated") for model in MODELS]
    return [
        (model, strategy)
        for strategy in STRATEGIES
        for model in MODELS
        if model != "tiny_mha" or strategy == "replicated"
    ]


def every_triple(tp: int, device: str = "cpu") -> list[Case]:
    """A covering design of strength 3 over engine kind x chunk_pages x adopted KV x store:
    the whole product of the three largest factors (kind, chunk_pages, adopted), the store
    chosen by the parity of the row's indices, so every three factors' values meet in some
    case (`test_the_design_meets_every_triple` checks it)."""
    return [
        Case(model, strategy, chunk, adopted, STORES[(k + c + a) % 2], tp, device)
        for k, (model, strategy) in enumerate(engine_kinds(tp))
        for c, chunk in enumerate(CHUNK_PAGES)
        for a, adopted in enumerate(ADOPTED)
    ]


def whole_product(tp: int, device: str = "cpu") -> list[Case]:
    return [
        Case(model, strategy, chunk, adopted, store, tp, device)
        for model, strategy in engine_kinds(tp)
        for chunk in CHUNK_PAGES
        for adopted in ADOPTED
        for store in STORES
    ]


Adopted = dict[object, torch.Tensor] | None


def adopted_kv(job: pipeline.Job, how: str, device: str) -> Adopted:
    """None (the engine allocates), one tensor per (pool kind, layer), or one stacked tensor
    per pool kind: shaped as the engine would allocate them, as a serving engine keeps them.
    `per_layer_strided` / `stacked_strided`: the same, but views that are not contiguous
    (every other row element of a twice-as-wide buffer)."""
    if how == "none":
        return None
    base, strided = how.removesuffix("_strided"), how.endswith("_strided")
    pages = job.workload.device_tokens // job.model.page_size

    def tensor(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        wide = (*shape[:-1], 2 * shape[-1]) if strided else shape
        t = torch.zeros(wide, dtype=dtype, device=device)
        return t[..., ::2] if strided else t

    units = job.model.units
    if base == "per_layer":
        return {
            (u.pool, u.layer): tensor(
                *unit_shape(job.model, u, pages), dtype=unit_dtype(job.model, u)
            )
            for u in units
        }
    assert base == "stacked", how
    kinds = {u.pool: [v for v in units if v.pool == u.pool] for u in units}
    return {
        kind: tensor(
            len(of), *unit_shape(job.model, of[0], pages), dtype=unit_dtype(job.model, of[0])
        )
        for kind, of in kinds.items()
    }


def refusal(job: pipeline.Job, how: str, device: str) -> str:
    """What create_engine says about adopted KV that is not contiguous ('' if it took it)."""
    try:
        engine = pipeline.create_engine(job, device_kv=adopted_kv(job, how, device))
    except ValueError as e:
        return str(e)
    engine.close()
    return ""


def layers(engine: pipeline.Engine, job: pipeline.Job, kv: Adopted) -> list[torch.Tensor]:
    """Each unit's KV as bytes, [pages, rows per page, row bytes]: the caller's own tensors
    where it adopted them (so the engine must move the caller's memory), else the pool's."""
    units = job.model.units
    if kv is None:
        views = [engine.device_pool.layer(u) for u in units]
    elif all(isinstance(key, str) for key in kv):
        views = [kv[u.pool][[v for v in units if v.pool == u.pool].index(u)] for u in units]
    else:
        views = [kv[(u.pool, u.layer)] for u in units]
    return [v.view(torch.uint8) for v in views]


def first_difference(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> str:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not torch.equal(g.cpu(), w):
            return f"rank {dist.get_rank()}, unit {i}: {what} is not bit-exact"
    return ""


def settle(device: str) -> None:
    """The caller's writes to its KV are done before it hands pages over."""
    if device == "cuda":
        torch.cuda.synchronize()


def acked(engine: pipeline.Engine, kind: str) -> bool:
    """Poll until an ack of `kind` is released (acks release in submission order, so all
    before it are too). A poll is a collective that releases the same acks on every rank, so
    every rank polls as often."""
    return any(any(ack.kind == kind for ack in engine.poll()) for _ in range(MAX_POLLS))


def loaded(engine: pipeline.Engine, handle: pipeline.LoadHandle | WindowedLoad) -> None:
    """What a serving engine's forward does with a load: the gate, a wait per layer, the ack."""
    engine.begin_forward()
    for layer in range(handle.num_layers):
        handle.wait(layer)
    handle.done().wait()


def run_case(case: Case, job: pipeline.Job) -> str:
    """Fill pages 0..6, back them up into allocated host slots, load them into pages 8..14;
    with a store, write them back, drop them from the host (reuse) and load_from_l3 into the
    zeroed device. '' when every step was bit-exact on this rank, else the first difference.
    What a case raises is raised naming the case: the spawn then fails at once, where going
    on would leave a peer waiting for this rank in a collective of the failed case."""
    kv = adopted_kv(job, case.adopted, case.device)
    try:
        engine = pipeline.create_engine(job, device_kv=kv)
        try:
            return round_trip(engine, job, case, layers(engine, job, kv))
        finally:
            engine.close()
    except Exception as e:
        e.add_note(f"in the API grid's case {case}")
        raise


def round_trip(
    engine: pipeline.Engine,
    job: pipeline.Job,
    case: Case,
    kv: list[torch.Tensor],
    *,
    salt: int = 0,
) -> str:
    """`run_case`'s steps on `engine`; `salt`: another seed and other tokens (so other L3
    keys), that engines sharing a world and a store hold bytes of their own."""
    page = job.model.page_size
    source = torch.arange(0, PAGES * page)
    target = torch.arange(TARGET * page, (TARGET + PAGES) * page)
    # MLA ranks hold the same latent KV; MHA ranks hold their own heads
    seed = PAGES + 1000 * salt + (dist.get_rank() if case.model == "tiny_mha" else 0)
    generator = torch.Generator().manual_seed(seed)
    for layer in kv:
        random = torch.randint(0, 256, layer[:PAGES].shape, generator=generator, dtype=torch.uint8)
        layer[:PAGES].copy_(random)
    before = [layer[:PAGES].to("cpu", copy=True) for layer in kv]
    settle(case.device)
    host = engine.host_slots.alloc(PAGES * page)
    engine.backup(host, source).wait()
    loaded(engine, engine.load(host, target))
    said = first_difference([t[TARGET : TARGET + PAGES] for t in kv], before, "load")
    if said or case.store == "none":
        return said
    keys = engine.l3_keys([1000 * salt + token for token in range(PAGES * page)])
    engine.write_back(keys, host).wait()
    if not acked(engine, "write_back"):
        return f"rank {dist.get_rank()}: no write_back ack in {MAX_POLLS} polls"
    engine.host_slots.reuse(host)  # evicted from the host: L3 holds the pages
    for layer in kv:
        layer.zero_()
    settle(case.device)
    from_l3 = engine.load_from_l3(keys, host, target)
    if from_l3.hits != PAGES or from_l3.handle is None:
        return f"rank {dist.get_rank()}: load_from_l3 gave {from_l3} for {PAGES} pages"
    loaded(engine, from_l3.handle)
    said = first_difference([t[TARGET : TARGET + PAGES] for t in kv], before, "load_from_l3")
    engine.host_slots.free(host)
    return said


@dataclass(frozen=True)
class Grid:
    """What the ranks of one spawn run: the cases with their jobs (composed once, in the
    parent: composing is most of a case's time), and per model a job whose adopted views
    that are not contiguous must be refused."""

    cases: list[tuple[Case, pipeline.Job]]
    refusals: list[tuple[Case, pipeline.Job]]

    @staticmethod
    def of(cases: list[Case], store_root: Path) -> Grid:
        """Each case's file store in its own folder under `store_root`."""
        for i in range(len(cases)):
            (store_root / str(i)).mkdir()
        first = {case.model: replace(case, store="none") for case in cases}.values()
        return Grid(
            cases=[(case, case.job(store_root / str(i))) for i, case in enumerate(cases)],
            refusals=[(case, case.job(None)) for case in first],
        )


def run_cases(grid: Grid, rank: int, world_size: int, local_rank: int) -> dict[str, list[str]]:
    """Every case in turn on this rank (one spawn serves many): '' or the first difference
    each; and what create_engine said to each model's non-contiguous views (per layer, then
    stacked), in the caller's group of this many ranks."""
    return {
        "cases": [run_case(case, job) for case, job in grid.cases],
        "refused": [
            refusal(job, f"{how}_strided", case.device)
            for case, job in grid.refusals
            for how in ("per_layer", "stacked")
        ],
    }
