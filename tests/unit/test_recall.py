"""A composition kept for the process: the same overrides over the same registered options
give a copy of the same config, which its caller may change; another folder's option of the
same name is another composition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.config.app import configs
from pipeline.config.recall import _composed, composition

OVERRIDES = ["model=tiny_dsa", "strategy=rotating", "strategy.chunk_pages=3"]


@pytest.fixture
def shipped() -> Iterator[None]:
    with configs(None):
        yield


def folder_with(tmp_path: Path, name: str, chunk_pages: int) -> str:
    """A user folder with one strategy option `mine`."""
    folder = tmp_path / name
    (folder / "strategy").mkdir(parents=True)
    text = f"defaults:\n  - rotating\n  - _self_\nname: mine\nchunk_pages: {chunk_pages}\n"
    (folder / "strategy" / "mine.yaml").write_text(text)
    return str(folder)


def test_the_same_overrides_come_back_as_a_copy_of_their_own(shipped: None) -> None:
    first = composition(OVERRIDES, hydra_node=True)
    hits = _composed.cache_info().hits
    again = composition(OVERRIDES, hydra_node=True)
    assert _composed.cache_info().hits == hits + 1
    assert OmegaConf.to_container(again) == OmegaConf.to_container(first)
    first.strategy.chunk_pages = 5  # a caller's change stays its own
    assert composition(OVERRIDES, hydra_node=True).strategy.chunk_pages == 3
    assert "hydra" not in composition(OVERRIDES, hydra_node=False)


def test_a_folders_options_are_part_of_what_is_kept(tmp_path: Path) -> None:
    """Two folders with an option of one name: each composes its own."""
    chunks = []
    for name, pages in (("a", 2), ("b", 7), ("a2", 2)):
        with configs(folder_with(tmp_path, name, pages)):
            chunks.append(composition(["strategy=mine"], hydra_node=False).strategy.chunk_pages)
    assert chunks == [2, 7, 2]
