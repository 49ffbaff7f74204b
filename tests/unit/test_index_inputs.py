"""Every public call that takes slot tensors refuses each malformed one with a ValueError naming
the argument, before anything changes (sparse, float, bool, 2-D, negative, out of range, a page
twice, misaligned, empty, on another device, another integer width, not a tensor), and takes
every well-formed kind (contiguous or not) bit-exact."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.jobs.contents import fill_random, first_mismatch, poison, snapshot

pytestmark = pytest.mark.usefixtures("one_rank")

PAGES = 2


@pytest.fixture
def engine(tmp_path: Path, one_rank: None) -> Iterator[Engine]:
    base = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"]
    made = pipeline.create_engine(pipeline.compose([*base, f"storage.path={tmp_path}"]))
    try:
        yield made
    finally:
        made.close()


def malformed(good: torch.Tensor, num_pages: int, size: int) -> dict[str, Any]:
    """Each kind of bad slot list, made from a good one of PAGES pages."""
    return {
        "sparse": good.to_sparse(),
        "float": good.float(),
        "bool": good.bool(),
        "2-D": good.reshape(PAGES, -1),
        "0-D": good[0],
        "empty": good[:0],
        "negative": page_tokens([-1, 0], size),
        "out of range": page_tokens([0, num_pages], size),
        "a page twice": torch.cat([good[:size], good[:size]]),
        "misaligned": good + 1,
        "on another device": good.to("meta"),
        "int32": good.int(),
        "int16": good.short(),
        "uint8": good.to(torch.uint8),
        "a list": good.tolist(),
    }


def refused(call: Callable[[], Any]) -> str:
    """The ValueError `call` raises (any other outcome fails the test with what it did)."""
    try:
        call()
    except ValueError as e:
        return str(e)
    except Exception as e:  # the finding: another kind of error
        return f"not a ValueError: {type(e).__name__}: {e}"
    return "accepted"


def test_every_call_refuses_every_malformed_slot_list_naming_it(engine: Engine) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    host_pages, device_pages = engine.sizing.host.num_pages, engine.sizing.device_pages
    held = slots.alloc(PAGES * size)
    device = page_tokens([0, 1], size)
    engine.backup(held, device).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, held).wait()
    fresh = slots.alloc(PAGES * size)
    prefetch = engine.prefetch(keys, fresh)
    empty = slots.alloc(PAGES * size)
    calls: dict[tuple[str, str], Callable[[Any], Any]] = {
        ("backup", "host_indices"): lambda bad: engine.backup(bad, device),
        ("backup", "device_indices"): lambda bad: engine.backup(held, bad),
        ("load", "host_indices"): lambda bad: engine.load(bad, device),
        ("load", "device_indices"): lambda bad: engine.load(held, bad),
        ("write_back", "host_indices"): lambda bad: engine.write_back(keys, bad),
        ("load_from_l3", "host_indices"): lambda bad: engine.load_from_l3(keys, bad, device),
        ("load_from_l3", "device_indices"): lambda bad: engine.load_from_l3(keys, empty, bad),
        ("prefetch", "host_indices"): lambda bad: engine.prefetch(keys, bad),
        ("load_prefetched", "device_indices"): lambda bad: engine.load_prefetched(prefetch, bad),
        ("host_slots.free", "host_slots"): lambda bad: slots.free(bad),
        ("host_slots.reuse", "host_slots"): lambda bad: slots.reuse(bad),
    }
    free, wrong = slots.num_free, []
    for (call, name), make in calls.items():
        pages = device_pages if name == "device_indices" else host_pages
        good = device if name == "device_indices" else held
        for kind, bad in malformed(good, pages, size).items():
            said = refused(lambda make=make, bad=bad: make(bad))
            if name not in said or said.startswith("not a ValueError"):
                wrong.append(f"{call}({name}={kind}): {said}")
    assert wrong == []
    assert slots.num_free == free and not prefetch.ended  # nothing changed
    prefetch.cancel()


def test_every_well_formed_kind_of_slot_list_moves_bit_exact(engine: Engine) -> None:
    slots, size = engine.host_slots, engine.sizing.slots_per_page
    fill_random(engine, [0, 1], 3)
    expected = snapshot(engine, [0, 1])
    source = page_tokens([0, 1], size)
    strided = torch.stack([source, source], 1)[:, 0]  # the same slots, not contiguous
    assert not strided.is_contiguous()
    for device, target in ((source, [2, 3]), (strided, [4, 5])):
        host = slots.alloc(PAGES * size)
        spread = torch.stack([host, host], 1)[:, 0]
        engine.backup(spread, device).wait()
        poison(engine, target)
        moved = page_tokens(target, size)
        engine.load(spread, torch.stack([moved, moved], 1)[:, 0]).done().wait()
        assert first_mismatch(engine, target, expected) == ""
        keys = engine.l3_keys(list(range(100, 100 + PAGES * size)))
        engine.write_back(keys, spread).wait()
        while engine.acks.pending:
            engine.poll()
        slots.free(spread)
        again = slots.alloc(PAGES * size)
        poison(engine, target)
        loaded = engine.load_from_l3(keys, torch.stack([again, again], 1)[:, 0], moved)
        assert loaded.hits == PAGES and loaded.handle is not None
        loaded.handle.done().wait()
        assert first_mismatch(engine, target, expected) == ""
        slots.free(again)
