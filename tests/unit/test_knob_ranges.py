"""Every number validate accepts runs, or validate refuses it: each numeric knob of every
group has a range (`pipeline.config.ranges`), its bounds are taken by the checks that run
without a rank, and a value past either is refused naming the knob."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator

import pytest
from omegaconf import DictConfig, OmegaConf

from pipeline.config.app import configs
from pipeline.config.checked import job_of
from pipeline.config.compose import Session
from pipeline.config.ranges import RANGES, Range, ranges_table
from pipeline.config.schema import GROUP_SCHEMAS
from pipeline.core.cost import Links, link_range

BASE = ["model=tiny_dsa", "storage=file"]
"""A config where every knob takes part (the indexer's too)."""


def numeric_fields(schema: type, prefix: str) -> Iterator[str]:
    """Every int, float or list-of-int field of a schema, nested sections included."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        hint = (
            args[0]
            if typing.get_origin(hints[f.name]) is not None and len(args) == 1
            else hints[f.name]
        )
        if dataclasses.is_dataclass(hint):
            yield from numeric_fields(hint, f"{prefix}.{f.name}")  # type: ignore[arg-type]
        elif hint in (int, float) or typing.get_args(hint) in ((int,), (float,)):
            yield f"{prefix}.{f.name}"


def test_every_numeric_knob_has_a_range() -> None:
    """A knob added without a range fails here: name what the code can run."""
    knobs = [k for group, schema in GROUP_SCHEMAS.items() for k in numeric_fields(schema, group)]
    assert sorted(knobs) == sorted(RANGES)
    assert all(
        0 < link_range(f.name)[0] < link_range(f.name)[1] for f in dataclasses.fields(Links)[1:]
    )
    assert all(r.least <= r.most for r in RANGES.values())
    assert ranges_table().count("\n") == len(RANGES) + 1


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    with configs(None):
        yield Session.compose(BASE)


def checked(session: Session, values: dict[str, object]) -> list:
    """The problems of the base config with these knobs set (what validate runs)."""
    cfg: DictConfig = session.cfg.copy()
    for key, value in values.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return job_of(cfg, session.strategy_option, session.with_strategy)[1]


def bound(key: str, span: Range, side: str) -> object:
    """A value at a bound ('least', 'most') or just past it ('below', 'above')."""
    whole = (
        isinstance(span.least, int) and isinstance(span.most, int) and key != "simulate.arrive_prob"
    )
    step = 1 if whole else None
    value = {
        "least": span.least,
        "most": span.most,
        "below": span.least - step if step else span.least / 2 if span.least else -0.5,
        "above": span.most + step if step else span.most * 2,
    }[side]
    lists = {"bench.sizes", "bench.chunk_pages", "bench.cuda_graph_cache", "bench.new_tokens"}
    return [value] if key in lists | {"simulate.seeds", "model.indexer.layers"} else value


@pytest.mark.parametrize("key", list(RANGES))
def test_each_knob_at_its_most_is_taken_by_every_check(session: Session, key: str) -> None:
    """Alone at its largest value, no check crashes and none calls it out of range (another
    rule joining groups may still refuse it, naming its own key)."""
    problems = checked(session, {key: bound(key, RANGES[key], "most")})
    assert not [p for p in problems if p.key == key and "must lie in" in p.message], problems


@pytest.mark.parametrize("side", ["least", "below", "above"])
@pytest.mark.parametrize("group", list(GROUP_SCHEMAS))
def test_each_group_at_its_least_or_past_its_bounds(session: Session, group: str, side: str):
    """Every knob of a group at once: at the least value none is out of range; just past
    either bound each is refused, naming itself."""
    keys = [k for k in RANGES if k.startswith(group + ".")]
    problems = checked(session, {k: bound(k, RANGES[k], side) for k in keys})
    named = {p.key for p in problems}
    if side == "least":
        assert not [p for p in problems if p.key in keys and "must lie in" in p.message]
    else:
        assert set(keys) <= named, sorted(set(keys) - named)
