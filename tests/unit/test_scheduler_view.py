"""The scheduler's view of the store on its own (`pipeline.open_store`): which objects it asks
for, and what it refuses. Its answers against real ranks: tests/distributed/test_store_view.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipeline
from pipeline.engine.l3.stores import FileStore


def view_of(tmp_path: Path, *overrides: str) -> pipeline.StoreView:
    job = pipeline.compose(["storage=file", f"storage.path={tmp_path}", *overrides])
    return pipeline.open_store(job)


def test_a_page_is_found_only_where_every_share_of_it_is(tmp_path: Path) -> None:
    """MHA at tp2: each rank's heads are their own object; a page both ranks can load has
    both, and the leading run stops at the first page that lacks either."""
    with view_of(tmp_path, "model=tiny_mha", "topology=tp2") as view:
        keys = view.keys(range(16))
        names = [[obj.name(view.space, key) for obj in view.objects] for key in keys]
        assert [name.rsplit("-", 1)[1] for name in names[0]] == ["s0of2", "s1of2"]
        store = FileStore(str(tmp_path))
        for name in [*names[0], names[1][0], *names[2]]:  # page 1: one rank's share only
            store.put(name, [b"x"])
        assert view.lookup(keys) == 1
        assert [view.contains(key) for key in keys] == [True, False, True, False]
        store.close()


def test_below_min_hit_pages_a_lookup_reports_none(tmp_path: Path) -> None:
    with view_of(tmp_path, "storage.min_hit_pages=2") as view:
        keys = view.keys(range(8))
        FileStore(str(tmp_path)).put(view.objects[0].name(view.space, keys[0]), [b"x"])
        assert view.contains(keys[0]) and view.lookup(keys) == 0


def test_a_view_needs_a_store_it_can_reach(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage=none"):
        pipeline.open_store(pipeline.compose([]))
    with pytest.raises(ValueError, match="a library caller gives the store"):
        pipeline.open_store(pipeline.compose(["storage=mooncake"]))
    with view_of(tmp_path) as view, pytest.raises(ValueError, match="not page keys"):
        view.lookup(["../../etc/passwd"])
