"""A load from L3 streamed a group of layers at a time (`storage.stream_layers`): it returns
before the later groups are read, each group's reads take only its layers, a layer is usable
once its wait returns, a group that goes missing fails the load, and the grid of group sizes
x load groups x host layouts x stores is bit-exact."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.engine.l3 import batch, runs
from pipeline.engine.l3.batch import batched
from pipeline.engine.l3.groups import AUTO_GROUPS, group_starts, layer_groups
from pipeline.engine.l3.handles import WindowedLoad
from pipeline.engine.l3.load import MIN_GROUP_BYTES, StreamedLoad, auto_layers, streamed_layers
from pipeline.engine.l3.stores import FileStore, MooncakeStore
from pipeline.engine.l3.stores.file_parts import FileParts
from pipeline.engine.l3.tier import L3Tier
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot
from pipeline.jobs.l3_store import master_on_loopback
from tests.unit.test_unit_reads import Spy

PAGES = 5


@contextlib.contextmanager
def engine_with(tmp_path: Path, *overrides: str, store: str = "file") -> Iterator[Engine]:
    """A one-rank CPU engine of tiny_mla with `store` attached."""
    with contextlib.ExitStack() as stack:
        if store == "file":
            where = [f"storage.path={tmp_path}"]
        else:
            master, metadata = stack.enter_context(master_on_loopback())
            where = [f"storage.master={master}", f"storage.metadata_server={metadata}"]
        base = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", f"storage={store}"]
        engine = pipeline.create_engine(pipeline.compose([*base, *where, *overrides]))
        stack.callback(engine.close)
        yield engine


def stored_prefix(engine: Engine) -> tuple[list[str], dict[int, torch.Tensor]]:
    """PAGES device pages backed up and written back: (their keys, their bytes by unit)."""
    size, source = engine.sizing.slots_per_page, list(range(PAGES))
    fill_random(engine, source, 11)
    expected = snapshot(engine, source)
    host = engine.host_allocator.alloc(PAGES)
    engine.backup(page_tokens(host, size), page_tokens(source, size)).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, page_tokens(host, size)).wait()
    while engine.acks.pending:
        engine.poll()
    return keys, expected


def load(engine: Engine, keys: list[str]) -> tuple[Any, list[int], list[int]]:
    """A load from L3 of `keys` into poisoned device pages: (what came back, its target
    pages, its fresh host pages)."""
    size = engine.sizing.slots_per_page
    fresh, target = engine.host_allocator.alloc(PAGES), list(range(PAGES, 2 * PAGES))
    poison(engine, target)
    loaded = engine.load_from_l3(keys, page_tokens(fresh, size), page_tokens(target, size))
    return loaded, target, fresh


def layer_intact(engine: Engine, layer: int, target: list[int], expected: dict) -> bool:
    pool = engine.device_pool
    units = [u for u in engine.model.units if u.layer == layer]
    return all(
        torch.equal(pool.layer(u).view(torch.uint8)[target], expected[u.ordinal]) for u in units
    )


@pytest.mark.usefixtures("one_rank")
def test_the_load_returns_before_the_later_groups_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The later groups' reads (or, read in the fetch's own call, their checks) are held
    back until the forward has used layer 0: the load still returns, layer 0 is whole after
    its wait, the last layer is not ready; then every layer arrives, bit-exact, each read
    having taken only its group's bytes."""
    one_step_per_layer = "strategy.load_group_bytes=0"  # else a load group waits for them all
    with engine_with(
        tmp_path, "storage.stream_layers=2", "storage.io_threads=2", one_step_per_layer
    ) as engine:
        keys, expected = stored_prefix(engine)
        held, held_back = threading.Event(), [False]

        def holding(real: Any) -> Any:  # every later group's run of pages, native or not
            def read(*args: Any) -> Any:
                if held_back[0]:
                    assert held.wait(60), "the test never let the later reads go"
                return real(*args)

            return read

        def held_group(*args: Any) -> Any:  # a later group read in the fetch's own call
            assert held.wait(60), "the test never let the later reads go"
            return real_group(*args)

        real_group = batch.group_read
        monkeypatch.setattr(runs, "read_run", holding(runs.read_run))
        monkeypatch.setattr(runs, "read_groups", holding(runs.read_groups))
        monkeypatch.setattr(batch, "group_read", held_group)
        with engine.trace.capture() as ops:
            tier = engine.l3
            assert tier is not None
            real_fetch = tier.fetch

            def fetch(stages: Any, job: Any) -> Any:
                done = real_fetch(stages, job)
                held_back[0] = True  # group 0 is agreed: hold every later read
                return done

            monkeypatch.setattr(tier, "fetch", fetch)
            loaded, target, _ = load(engine, keys)
            handle = loaded.handle
            assert isinstance(handle, StreamedLoad) and loaded.hits == PAGES
            handle.wait(0)
            handle.load.stream.synchronize()
            assert layer_intact(engine, 0, target, expected)
            assert not handle.ready(handle.num_layers - 1)
            held.set()
            for layer in range(handle.num_layers):
                handle.wait(layer)
            handle.done().wait()
        assert not first_mismatch(engine, target, expected)
        reads = [fields for kind, fields in ops if kind == "l3_read"]
        groups = -(-engine.model.num_layers // 2)
        assert len(reads) == PAGES * groups
        per_layer = sum(u.page_bytes for u in engine.model.units) // engine.model.num_layers
        assert {r["bytes"] for r in reads} <= {per_layer, 2 * per_layer}


@pytest.mark.usefixtures("one_rank")
def test_a_later_group_that_fails_its_check_fails_the_load(tmp_path: Path) -> None:
    """A byte of page 3's layer 2 flipped in the store: its first group (layer 0 alone) reads
    intact, so every page is a hit and the load returns; the forward's waits raise by layer
    1 (its group: layers 1-2), naming the page and the layers, the ack fails, the fresh host
    pages hold no data, and the engine loads again afterwards."""
    with engine_with(tmp_path, "storage.stream_layers=2") as engine:
        keys, expected = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        name, unit = tier.name(keys[3]), next(u for u in tier.object.units if u.layer == 2)
        at = (
            tier.object.header_size(tier.space, name, tier.checks)
            + tier.object.offsets[unit.ordinal]
        )
        with open(tmp_path / name, "r+b") as f:
            f.seek(at)
            flipped = f.read(1)[0] ^ 0x01
            f.seek(at)
            f.write(bytes([flipped]))
        loaded, _, fresh = load(engine, keys)
        handle = loaded.handle
        assert loaded.hits == PAGES and handle is not None
        with pytest.raises(RuntimeError, match=r"layers 1-2 not loaded.*page 3") as failed:
            for layer in range(3):
                handle.wait(layer)
        assert "load_from_l3" in str(failed.value)
        with pytest.raises(RuntimeError, match="layers 1-2"):
            handle.done().wait()
        assert sorted(engine.host_allocator.without_data(np.array(fresh))) == sorted(fresh)
        engine.host_allocator.free(fresh)
        with contextlib.suppress(RuntimeError):
            while engine.acks.pending:
                engine.poll()
        size = engine.sizing.slots_per_page
        more, target = engine.host_allocator.alloc(3), [0, 1, 2]
        poison(engine, target)
        again = engine.load_from_l3(keys[:3], page_tokens(more, size), page_tokens(target, size))
        assert again.hits == 3 and again.handle is not None
        again.handle.done().wait()
        assert not first_mismatch(engine, target, {u: t[:3] for u, t in expected.items()})


@pytest.mark.usefixtures("one_rank")
def test_later_groups_read_no_header_and_check_against_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pages are read one at a time (a keyed check: its digests do not combine, so no
    native batch), a later group reads only its layers' bytes (never the header), a task per
    run of pages and I/O thread reading every later group, checked against the digest table
    its page's first group read: page 3's object replaced after the hits by page 2's (whose
    own header is whole) fails the load."""
    key = tmp_path.parent / f"{tmp_path.name}.key"
    key.write_bytes(bytes(range(32)))
    key.chmod(0o600)
    streamed = ["storage.stream_layers=2", "storage.io_threads=2"]
    with engine_with(tmp_path, *streamed, f"storage.auth_key_file={key}") as engine:
        keys, _ = stored_prefix(engine)
        tier = engine.l3
        assert tier is not None
        real_fetch, real_read, real_parts = tier.fetch, FileStore.read, FileParts.read_parts
        real_spans = FileParts.read_spans
        real_submit = tier.io.submit
        starts: list[int] = []
        later: list[int] = []
        tasks = [0]

        def read(store: FileStore, name: str, size: int, ranges: Any, check: Any = None) -> bool:
            starts.append(ranges[0][0])
            return real_read(store, name, size, ranges, check)

        def read_parts(reader: FileParts, reads: Any) -> int:
            later.extend(ranges[0][0] for _, _, ranges, _ in reads)
            return real_parts(reader, reads)

        def read_spans(reader: FileParts, spans: Any) -> int:
            later.extend(spans.offsets)
            return real_spans(reader, spans)

        def submit(fn: Any, *args: Any, **kwargs: Any) -> Any:
            tasks[0] += 1
            return real_submit(fn, *args, **kwargs)

        def fetch(stages: Any, job: Any) -> Any:
            done = real_fetch(stages, job)
            assert len(starts) == PAGES  # the first group, with the header
            (tmp_path / tier.name(keys[3])).write_bytes(
                (tmp_path / tier.name(keys[2])).read_bytes()
            )
            monkeypatch.setattr(tier.io, "submit", submit)
            return done

        monkeypatch.setattr(FileStore, "read", read)
        monkeypatch.setattr(FileParts, "read_parts", read_parts)
        monkeypatch.setattr(FileParts, "read_spans", read_spans)
        monkeypatch.setattr(tier, "fetch", fetch)
        loaded, _, _ = load(engine, keys)
        handle = loaded.handle
        assert loaded.hits == PAGES and handle is not None
        with pytest.raises(RuntimeError, match=r"layers 1-2 not loaded.*page 3"):
            handle.done().wait()
        assert tasks[0] == 2  # pages 0-2 and 3-4, each task reading every later group
        after = starts[PAGES:] + later  # staged reads go page by page, direct ones in runs
        assert set(starts[:PAGES]) == {0} and after and min(after) > 0


GRID = [
    *(
        ("file", layout, group_bytes, per_group)
        for layout in ("layer_first", "page_first", "page_first_direct")
        for group_bytes in (0, 1 << 30)
        for per_group in (1, 2, 3, 5)
    ),
    ("mooncake", "layer_first", 0, 2),
    ("mooncake", "page_first", 0, 3),
    ("mooncake", "page_first_direct", 1 << 30, 3),
]
"""Every case on the file store; Mooncake (a master per case, seconds each) at two."""


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(("store", "layout", "group_bytes", "per_group"), GRID)
def test_streamed_loads_are_bit_exact_across_the_grid(
    tmp_path: Path, store: str, layout: str, group_bytes: int, per_group: int
) -> None:
    """The first layer a group alone, then per_group layers a group, no load step spanning
    two; each layer whole right after its own wait (the forward's order), then every page.
    Mooncake keeps each page's object as a piece a group (what an explicit stream_layers
    asks for), and the load reads them whole: no ranged get."""
    overrides = [
        f"storage.stream_layers={per_group}",
        f"topology.mem_layout={layout}",
        f"strategy.load_group_bytes={group_bytes}",
    ]
    with engine_with(tmp_path, *overrides, store=store) as engine:
        keys, expected = stored_prefix(engine)
        calls: Counter[str] = Counter()
        if store == "mooncake":
            tier = engine.l3
            assert isinstance(tier, L3Tier) and isinstance(tier.store, MooncakeStore)
            pieces = [tier.store.pieces.forms(tier.name(k)) for k in keys]
            assert all(
                tier.store.held(forms) == [False] + [True] * (len(forms) - 1) for forms in pieces
            )
            assert len(pieces[0]) - 1 == len(range(1, engine.model.num_layers, per_group)) + 1
            tier.store.client = Spy(tier.store.client, calls)  # type: ignore[assignment]
        loaded, target, _ = load(engine, keys)
        handle = loaded.handle
        assert isinstance(handle, StreamedLoad) and loaded.hits == PAGES
        # the first layer a group alone, then per_group a group; no step spans two groups
        layers = engine.model.num_layers
        groups = [
            [0],
            *(list(range(a, min(a + per_group, layers))) for a in range(1, layers, per_group)),
        ]
        assert [sorted({x for s in steps for x in s.layers}) for steps in handle.steps] == groups
        for layer in range(handle.num_layers):
            handle.wait(layer)
            engine.runtime.load_stream.synchronize()
            assert layer_intact(engine, layer, target, expected), layer
        handle.done().wait()
        assert not first_mismatch(engine, target, expected)
        ranged = calls["batch_get_into_multi_buffer_ranges"] + calls["get_into_ranges"]
        assert ranged == 0 and (store == "file" or calls["batch_get_into_multi_buffers"]), calls


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    "overrides",
    [["storage.stream_layers=0"], [], ["storage.stream_layers=2", "strategy.verify_every=1"]],
    ids=["off", "default", "verifying"],
)
def test_loads_that_must_not_stream_are_windowed(tmp_path: Path, overrides: list[str]) -> None:
    """Off, the default on a CPU rank (null streams only onto a GPU) and a load that
    verifies across ranks read whole objects."""
    with engine_with(tmp_path, *overrides) as engine:
        keys, expected = stored_prefix(engine)
        loaded, target, _ = load(engine, keys)
        assert isinstance(loaded.handle, WindowedLoad)
        loaded.handle.done().wait()
        assert not first_mismatch(engine, target, expected)


@pytest.mark.parametrize("layers", [1, 2, 8, 61])
@pytest.mark.parametrize("per_group", [1, 3, 8, 61])
@pytest.mark.parametrize("starts", [None, [1, 2, 4]], ids=["even", "growing"])
def test_layer_groups_cut_the_units_where_their_starts_say(
    layers: int, per_group: int, starts: list[int] | None
) -> None:
    """Every unit in exactly one group, in layer order; the first layer alone; a group
    begins at each start and holds the layers up to the next (an even cut: per_group each)."""
    cut = group_starts(layers, per_group) if starts is None else [s for s in starts if s < layers]
    units = tuple(
        SimpleNamespace(layer=layer, ordinal=o) for layer in range(layers) for o in (0, 1)
    )
    groups = layer_groups(units, cut)  # type: ignore[arg-type]
    assert [u for g in groups for u in g] == list(units)
    bounds = [0, *cut, layers]
    assert len(groups) == len(bounds) - 1
    for g, (first, stop) in enumerate(itertools.pairwise(bounds)):
        assert {u.layer for u in groups[g]} == set(range(first, stop))
    if starts is None:
        assert list(cut) == list(range(1, layers, per_group))


@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("layers", [1, 8, 61, 78])
@pytest.mark.parametrize("groups_of", [MIN_GROUP_BYTES - 1, MIN_GROUP_BYTES, 40 * MIN_GROUP_BYTES])
def test_a_null_stream_layers_streams_an_eighth_of_the_layers_only_where_it_pays(
    gpu: bool, native: bool, layers: int, groups_of: int
) -> None:
    """Onto a GPU, read natively, each of 8 groups at least MIN_GROUP_BYTES: ceil(layers / 8)
    layers a group (61 layers: 8); anything short of that: whole objects."""
    found = auto_layers(layers, AUTO_GROUPS * groups_of, gpu=gpu, native=native)
    pays = gpu and native and groups_of >= MIN_GROUP_BYTES
    assert found == (-(-layers // 8) if pays else 0)
    assert AUTO_GROUPS == 8 and auto_layers(61, 1 << 40, gpu=True, native=True) == 8


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(("store", "streams"), [("file", True), ("mooncake", False)])
def test_a_null_stream_layers_streams_onto_a_gpu_only_from_a_store_reading_groups_at_speed(
    tmp_path: Path, store: str, streams: bool
) -> None:
    """The decision of a GPU rank's load (the engine's own, its device said to be cuda) over
    the real tier: the file store reads a group of layers as fast as whole objects and
    streams; Mooncake does not by default (`MooncakeUnits.groups`), so it reads whole."""
    with engine_with(tmp_path, "topology.mem_layout=page_first_direct", store=store) as engine:
        tier = engine.l3
        assert tier is not None and batched(tier, tier.reads(False), device=False)
        gpu_rank = SimpleNamespace(
            strategy=engine.strategy,
            verifies_next_load=engine.verifies_next_load,
            runtime=SimpleNamespace(device=torch.device("cuda")),
            model=engine.model,
        )
        found = streamed_layers(gpu_rank, tier, pages=1 << 20)  # type: ignore[arg-type]
        assert found == (-(-engine.model.num_layers // AUTO_GROUPS) if streams else 0)
