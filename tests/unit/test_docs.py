"""Help and docs checked against the code: every knob (dotted config key) that a subcommand's
`--help`, README.md or an example names exists, composed through the project's own `compose`
with its value; README's commands compose as written; README's shown command outputs are
produced by a test (named beside each) or marked abridged."""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from docsfns import pages
from hydra import initialize_config_module
from omegaconf import DictConfig, ListConfig, OmegaConf

import pipeline
from pipeline.cli.main import HELP, command_help
from pipeline.config.compose import Session
from pipeline.config.sources import SHIPPED
from pipeline.core.checks import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GROUPS = "model|topology|strategy|workload|runtime|bench|simulate|soak|storage|events"
KNOB = re.compile(rf"(?<![\w./-])({GROUPS})((?:\.[a-z_][a-z0-9_]*)+)(?![\w/(])")
SHORT = re.compile(rf"`({GROUPS})\.\*` \(")
FILES = {"json", "jsonl", "md", "png", "py", "yaml"}
"""A name that ends like a file is one (`bench.json`), not a knob."""
MISTAKES = {"strategy.chunk_page"}
"""Keys README names as the mistakes the CLI catches."""
BASES = ([], ["model=tiny_dsa"], ["storage=mooncake"], ["bench=l3"])
"""Where a knob may live: the default config, or the first option that has it."""
ABSENT = object()
GENERATED = {"docs/cli.md", "docs/configuration.md"}
"""Pages written from the code itself (tests/unit/test_generated_pages.py), whose option
tables name knobs by their short names."""


def sources() -> dict[str, str]:
    """Each text a user reads: the subcommands' help, README and the docs pages, the
    examples."""
    texts = {f"{name} --help": command_help(name) for name in HELP}
    texts.update(pages())
    for path in sorted((ROOT / "examples").glob("*.py")):
        texts[str(path.relative_to(ROOT))] = path.read_text()
    return texts


def short_knobs(text: str) -> Iterator[str]:
    """`bench.*` (`sizes`, `placements`, ...): the group's knobs by their short names."""
    for found in SHORT.finditer(text):
        depth, end = 1, found.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        inner = re.sub(r"\([^()]*\)", "", text[found.end() : end - 1])  # leave out asides
        for name in re.findall(r"`([a-z_][a-z0-9_]*)`", inner):
            yield f"{found.group(1)}.{name}"


def named_knobs() -> dict[str, set[str]]:
    """Every knob a text names -> the texts naming it."""
    knobs: dict[str, set[str]] = {}
    for where, text in sources().items():
        full = (m.group(1) + m.group(2) for m in KNOB.finditer(text))
        for key in [*full, *short_knobs(text)]:
            if key.rsplit(".", 1)[1] not in FILES and key not in MISTAKES:
                knobs.setdefault(key, set()).add(where)
    return knobs


def hydra_value(value: Any) -> str:
    """A composed value in Hydra's override grammar."""
    if isinstance(value, Enum):
        return value.name
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | ListConfig):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return str(value)


def test_the_texts_name_the_knobs_users_reach_for() -> None:
    """(The extraction itself: a knob of each kind of text is found.)"""
    knobs = named_knobs()
    assert {"soak.cycles", "bench.sizes", "strategy.idle_sync_skip.enabled"} <= set(knobs)
    assert "soak --help" in knobs["soak.warmup_cycles"]
    assert "bench.floor_bytes" in knobs and "bench.json" not in knobs
    assert "examples/scheduler.py" in knobs["workload.host_bytes"]


def test_every_knob_named_in_help_readme_and_examples_exists() -> None:
    """Each knob is set to its own value in one compose per config it lives in: an unknown
    key, or a value its own default cannot be, is a problem `compose` names."""
    knobs = named_knobs()
    placed: dict[int, list[str]] = {}
    unknown = []
    with initialize_config_module(config_module=SHIPPED, version_base="1.3"):
        configs = [Session.compose(list(base)).cfg for base in BASES]
    for key in sorted(knobs):
        where = next((i for i, c in enumerate(configs) if has(c, key)), None)
        if where is None:
            unknown.append(f"{key} (named in {', '.join(sorted(knobs[key]))})")
            continue
        value = OmegaConf.select(configs[where], key)
        if not isinstance(value, DictConfig) and not is_stage_list(value):
            placed.setdefault(where, []).append(f"{key}={hydra_value(value)}")
    assert unknown == []
    for where, overrides in placed.items():
        try:
            pipeline.compose([*BASES[where], *overrides])
        except ConfigError as e:
            pytest.fail(f"{BASES[where]}: {[(p.key, p.message) for p in e.problems]}")


def has(cfg: DictConfig, key: str) -> bool:
    return OmegaConf.select(cfg, key, default=ABSENT) is not ABSENT


def is_stage_list(value: Any) -> bool:
    return isinstance(value, ListConfig) and any(isinstance(v, DictConfig) for v in value)


COMMAND = re.compile(r"(?:^\$ |^|`)(?:hicache-pipeline|-m pipeline) ([a-z-]+)((?: [^`\n]+)?)", re.M)
SPAN = re.compile(r"`([^`\s]+=[^`]*)`")
SHOWN_MISTAKES = {
    "strategy.chunk_page=8",  # an unknown key: the did-you-mean
    "strategy=rotatingg",  # an unknown option
    "stratgy=rotating",  # an unknown group
    "strategy.chunk_pages=-1",  # a range mistake blamed on the override
    "workload.num_tokens=255",  # not whole pages
    "key=a,b",  # the sweep grammar
    "key=value",  # the override grammar
    "group.knob=value",
    "+key=value",
    "group=option",
    "into=pool|staging",  # a trace field, not an override
}
"""Overrides README shows as mistakes the checks catch, as grammar, or that are not overrides."""


def overrides_of(text: str) -> Iterator[list[str]]:
    """The overrides of each command README shows, and of each inline `key=value` span
    (placeholders such as DIR, HOST or `...`, sweeps and --config-dir left out)."""
    joined = text.replace("\\\n", " ")
    for found in COMMAND.finditer(joined):
        words = found.group(2).split()
        if "-m" in words or "--config-dir" in words or "--help" in words:
            continue
        words = [w.strip("'\"(),") for w in words]  # shell quotes, prose around a word
        yield [w for w in words if "=" in w and not w.startswith("-")]
    for found in SPAN.finditer(text):
        words = found.group(1).split()
        if all(re.fullmatch(r"[a-z_+~][\w.]*=\S+", w) for w in words):
            yield words


def test_the_docs_commands_and_overrides_compose_as_written() -> None:
    """`topology.dp_size=2` was said to give "tp8 dp2 (preset tp8)", and is refused without
    topology.dp_attention=true."""
    refused = []
    written = {page: text for page, text in pages().items() if page not in GENERATED}
    shown = {tuple(o) for text in written.values() for o in overrides_of(text)}
    for overrides in sorted(shown):  # each distinct command once
        if set(overrides) & SHOWN_MISTAKES or any(
            re.search(r"=(\.\.\.|[A-Z]+|n|<\w+>)$|\.\.\.", w)
            for w in overrides  # placeholders
        ):
            continue
        try:
            pipeline.compose(list(overrides))
        except ConfigError as e:
            refused.append((overrides, [p.message for p in e.problems]))
    assert refused == []
