"""An object that the store's key does not authenticate (written with another key, without a
key, or forged) is counted as such (`l3_forged`), apart from a corrupt payload (`l3_corrupt`)
and from a plain miss: a dashboard tells an attack or a misconfigured key from a bad disk."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import pipeline
from pipeline.core.slots import page_tokens
from pipeline.engine.engine import Engine
from pipeline.jobs.contents import fill_random

pytestmark = pytest.mark.usefixtures("one_rank")

PAGES = 2


def key_file(path: Path) -> str:
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


@contextlib.contextmanager
def engine_on(folder: Path, key: str | None) -> Iterator[Engine]:
    base = ["model=tiny_mla", "topology=tp1", "topology.device=cpu", "storage=file"]
    keyed = [f"storage.auth_key_file={key}"] if key else []
    folder.mkdir(exist_ok=True)
    engine = pipeline.create_engine(pipeline.compose([*base, f"storage.path={folder}", *keyed]))
    try:
        yield engine
    finally:
        engine.close()


def written(engine: Engine) -> list[str]:
    """PAGES pages of random KV backed up and written back: their keys."""
    size = engine.sizing.slots_per_page
    fill_random(engine, list(range(PAGES)), 5)
    host = engine.host_slots.alloc(PAGES * size)
    engine.backup(host, page_tokens(list(range(PAGES)), size)).wait()
    keys = engine.l3_keys(list(range(PAGES * size)))
    engine.write_back(keys, host).wait()
    while engine.acks.pending:
        engine.poll()
    return keys


def read_back(engine: Engine, keys: list[str]) -> tuple[int, int, dict[str, int]]:
    """(lookup's pages, the hits of a load of the first page, the counts of failed reads):
    one page, so that exactly one read fails (a second could be cancelled before it ran)."""
    size = engine.sizing.slots_per_page
    found = engine.lookup(keys)
    host = engine.host_slots.alloc(size)
    loaded = engine.load_from_l3(keys[:1], host, page_tokens([4], size))
    counts = engine.trace.counts
    kinds = ("l3_forged", "l3_corrupt", "l3_miss")
    return found, loaded.hits, {k: counts.get(k, 0) for k in kinds}


@pytest.mark.parametrize("writer", ["another key", "no key"])
def test_an_object_not_made_with_the_key_is_counted_forged(tmp_path: Path, writer: str) -> None:
    other = key_file(tmp_path / "other") if writer == "another key" else None
    with engine_on(tmp_path / "store", other) as engine:
        keys = written(engine)
    with engine_on(tmp_path / "store", key_file(tmp_path / "mine")) as engine:
        found, hits, counts = read_back(engine, keys)
        stats = engine.stats()
    assert (found, hits) == (PAGES, 0)  # there, and not loaded
    assert counts == {"l3_forged": 1, "l3_corrupt": 0, "l3_miss": 1}
    assert stats["hicache_l3_corrupt_objects_total"] == 0
    assert stats["hicache_l3_forged_objects_total"] == 1
    assert stats["hicache_l3_read_misses_total"] == 1


def test_a_damaged_payload_under_the_key_is_counted_corrupt(tmp_path: Path) -> None:
    key = key_file(tmp_path / "key")
    with engine_on(tmp_path / "store", key) as engine:
        keys = written(engine)
    (obj,) = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and keys[0] in p.name]
    raw = bytearray(obj.read_bytes())
    raw[-1] ^= 0xFF  # the header still holds: the payload changed after it was written
    obj.write_bytes(bytes(raw))
    with engine_on(tmp_path / "store", key) as engine:
        found, hits, counts = read_back(engine, keys)
    assert (found, hits) == (PAGES, 0)
    assert counts == {"l3_forged": 0, "l3_corrupt": 1, "l3_miss": 1}
