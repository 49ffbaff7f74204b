"""Write docs/configuration.md: every config group's options and every knob, from the schema
dataclasses (types, attribute docstrings), conf/ (the options, their leading comments and their
values) and the project's range checks (`--check`: exit 1 with a diff when the committed page
is stale). Run from the repository root: `python docs/tools/config_page.py`."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import itertools
import sys
import typing
from pathlib import Path
from typing import Any

from generated import attribute_docs, write_or_check  # beside this file
from omegaconf import OmegaConf

from pipeline.cli.catalog import defaults, description
from pipeline.config.app import configs
from pipeline.config.compose import composed
from pipeline.config.eligibility import RULES
from pipeline.config.links import presets
from pipeline.config.ranges import RANGES, number
from pipeline.config.schema import GROUP_SCHEMAS, Config
from pipeline.config.sources import shipped_options, shipped_root

PAGE = Path("docs/configuration.md")
GENERATOR = "docs/tools/config_page.py"
NONE = type(None)
INTRO = """\
Every config group, its options and every knob, generated from the schema dataclasses (type,
docstring), the shipped options under `conf/` and the range checks `validate` and every
command apply. A knob's **default** is its value in the default config (`conf/config.yaml`:
each group's default option, marked \\*), or the schema's where that leaves its section null;
an option's **sets** lists the knobs whose value differs from the default option's (its name
aside). A range is inclusive.

## Setting a knob

- `GROUP=OPTION` picks an option: `strategy=rotating`, `model=deepseek_v3`.
- `GROUP.KNOB=VALUE` sets a knob over the options: `workload.num_tokens=4096`,
  `bench.sizes=[16384,65536]`, `model.indexer=null`; `++GROUP.KNOB=VALUE` does the same.
  `+KEY=VALUE` (Hydra's append) is refused: every knob below exists already, and no other key
  does; `~KEY` is refused too (a typed knob is set, not deleted: `model.indexer=null`).
- `--config-dir DIR` adds your own options, `DIR/<group>/<name>.yaml` (e.g.
  `DIR/strategy/prod.yaml`: `defaults: [rotating, _self_]`, `name: prod`, `chunk_pages: 16`),
  and your deployment's defaults, `DIR/config.yaml` (a `defaults` list choosing an option per
  group, then knobs), which the command line overrides. Your files are checked as untrusted
  input and may not shadow a shipped option: `hicache-pipeline validate --config-dir DIR`
  checks them all.
"""


@dataclasses.dataclass(frozen=True)
class Knob:
    """One dotted key of the schema: its type, its docstring and its schema default."""

    key: str
    hint: Any
    doc: str
    default: Any
    """The schema's default (dataclasses.MISSING: the option must set it)."""


def unwrapped(hint: Any) -> tuple[Any, bool]:
    """(the type, whether null is allowed too)."""
    args = typing.get_args(hint)
    return (next(a for a in args if a is not NONE), True) if NONE in args else (hint, False)


def knobs(cls: type, prefix: str) -> list[Knob]:
    """Every dotted key of a schema, a section's own keys after it."""
    docs, hints, found = attribute_docs(cls), typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if callable(f.default_factory) else f.default
        found.append(Knob(prefix + f.name, hints[f.name], docs[f.name], default))
        inner = unwrapped(hints[f.name])[0]
        if dataclasses.is_dataclass(inner):
            found += knobs(typing.cast(type, inner), f"{prefix}{f.name}.")
    return found


def type_name(hint: Any) -> str:
    inner, optional = unwrapped(hint)
    if optional:
        return f"{type_name(inner)} or null"
    if typing.get_origin(hint) is list:
        return f"list of {type_name(typing.get_args(hint)[0])}"
    if hint is Any:
        return "stage"
    if dataclasses.is_dataclass(hint):
        return "section"
    return "choice" if issubclass(hint, enum.Enum) else hint.__name__


def text_rules() -> dict[str, str]:
    """What each text knob takes, as its check reads it (numbers: `RANGES`)."""
    storage = importlib.import_module(GROUP_SCHEMAS["storage"].__module__)
    strategies = ", ".join(f"`{name}`" for name in sorted(shipped_options()["strategy"]))
    name, size = f"matches `{storage.NAME.pattern}`", "a size, 1 B to 1e15 B: an int or `64GiB`"
    paths = ("runtime.trace_file", "bench.out_dir", "storage.path", "storage.auth_key_file")
    return {
        "strategy.requires": "each a rule: " + ", ".join(f"`{rule}`" for rule in sorted(RULES)),
        "strategy.fallback": f"a strategy option: {strategies}",
        "bench.strategies": f"each a strategy option: {strategies}",
        "runtime.links": ", ".join(f"`{p}`" for p in presets()) + ", or a links file",
        "runtime.metrics_address": "an address (from a config file: a loopback one)",
        "storage.master": "`auto`, or host:port",
        "storage.metadata_server": f"matches `{storage.METADATA_URL.pattern}`",
        **dict.fromkeys(("storage.model_revision", "storage.tenant"), name),
        **dict.fromkeys(("workload.host_bytes", "storage.capacity_bytes"), size),
        **dict.fromkeys(paths, "a path"),
    }


def allowed(knob: Knob, rules: dict[str, str]) -> str:
    """The values a knob takes: its range, its choices or its rule."""
    hint, optional = unwrapped(knob.hint)
    listed = typing.get_origin(hint) is list
    item, each = (typing.get_args(hint)[0], "each ") if listed else (hint, "")
    if knob.key in RANGES:
        span = RANGES[knob.key]
        text = f"{each}{number(span.least)} to {number(span.most)} ({span.why})"
    elif knob.key in rules:
        text = rules[knob.key]
    elif isinstance(item, type) and issubclass(item, enum.Enum):
        text = each + ", ".join(f"`{choice.value}`" for choice in item)
    elif item is bool:
        text = "`true`, `false`"
    elif item is Any:
        text = "each `_target_: stages.<module>.<Stage>`"
    else:
        text = "its keys below" if dataclasses.is_dataclass(item) else "any text"
    return text + (", or `null`" if optional else "")


def shown(value: Any) -> str:
    """A value as YAML would say it (a stage entry: its class, and its arguments if any)."""
    if isinstance(value, dict) and "_target_" in value:
        args = ", ".join(f"{k}={shown(v)}" for k, v in value.items() if k != "_target_")
        return value["_target_"].rsplit(".", 1)[-1] + (f"({args})" if args else "")
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return "''" if value == "" else str(value)


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf (a null section is a leaf)."""
    if not isinstance(node, dict) or "_target_" in node:
        return {prefix.rstrip("."): node}
    return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}


def row(cells: list[str]) -> str:
    """A table row (a `|` in a cell escaped: GitHub's tables need it even in code)."""
    return "| " + " | ".join(text.replace("|", "\\|") for text in cells) + " |"


KNOBS_HEAD = ["| knob | type | default | range | description |", "| --- | --- | --- | --- | --- |"]


def knob_row(knob: Knob, value: Any, rules: dict[str, str]) -> str:
    default = "required" if value is dataclasses.MISSING else f"`{shown(value)}`"
    if isinstance(value, dict):
        default = "(its keys below)"
    return row([f"`{knob.key}`", type_name(knob.hint), default, allowed(knob, rules), knob.doc])


def options_table(group: str, values: dict[str, dict], chosen: str) -> list[str]:
    """Each option, its leading comment's first sentence and the knobs it sets otherwise."""
    base, lines = flat(values[chosen]), ["| option | what it is | sets |", "| --- | --- | --- |"]
    for option, value in values.items():
        mine = flat(value)
        sets = [
            f"`{key}={shown(mine.get(key))}`"
            for key in sorted(mine.keys() | base.keys())
            if mine.get(key) != base.get(key) and not (key == "name" and mine[key] == option)
        ]
        what = description(str(shipped_root() / group / f"{option}.yaml"), 10**4)
        lines.append(
            row([f"`{option}`" + (" \\*" if option == chosen else ""), what, ", ".join(sets)])
        )
    return lines


def group_section(group: str, values: dict[str, dict], doc: str, rules: dict[str, str]) -> list:
    """One group: its options, then its knobs with the default option's values."""
    chosen = defaults()[group]
    lines = [f"## {group}", "", f"{doc} Pick an option with `{group}=OPTION`.", ""]
    lines += [*options_table(group, values, chosen), "", *KNOBS_HEAD]
    for knob in knobs(GROUP_SCHEMAS[group], f"{group}."):
        value = values[chosen]
        for part in knob.key.split(".")[1:]:
            value = value.get(part, knob.default) if isinstance(value, dict) else knob.default
        lines.append(knob_row(knob, value, rules))
    return [*lines, ""]


def option_values() -> tuple[dict[str, dict[str, dict]], dict]:
    """(group -> option -> its composed section, the default config), plain. The k-th option
    of every group composes in one config (a group's section never reads another's, and a
    composition takes most of a second)."""
    with configs(None) as loaded:
        by_group: dict[str, list[str]] = {group: [] for group in GROUP_SCHEMAS}
        for group, option, _ in loaded.sources.options():
            by_group[group].append(option)
        values: dict[str, dict[str, dict]] = {group: {} for group in GROUP_SCHEMAS}
        for picks in itertools.zip_longest(*by_group.values()):
            chosen = {g: o for g, o in zip(by_group, picks, strict=True) if o is not None}
            cfg = composed([f"{group}={option}" for group, option in chosen.items()])
            plain = typing.cast(dict, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
            for group, option in chosen.items():
                values[group][option] = plain[group]
        default = OmegaConf.to_container(composed([]), resolve=True, enum_to_str=True)
    return values, typing.cast(dict, default)


def page() -> str:
    """The whole page."""
    values, top = option_values()
    docs, rules = attribute_docs(Config), text_rules()
    lines = ["# Configuration", "", f"<!-- Generated by {GENERATOR}; do not edit. -->", "", INTRO]
    for group in GROUP_SCHEMAS:
        lines += group_section(group, values[group], docs[group], rules)
    lines += ["## runtime.links presets", "", "| preset | what it is |", "| --- | --- |"]
    for name in presets():
        what = description(str(shipped_root() / "links" / f"{name}.yaml"), 10**4)
        lines.append(row([f"`{name}`", what]))
    lines += ["", "## Top level", "", *KNOBS_HEAD]
    for knob in knobs(Config, ""):
        if "." not in knob.key and knob.key not in GROUP_SCHEMAS:
            lines.append(knob_row(knob, top[knob.key], rules))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(write_or_check(PAGE, page(), GENERATOR, "--check" in sys.argv))
