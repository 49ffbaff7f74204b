"""The generated docs pages are current and whole: docs/cli.md and docs/configuration.md are
what their generators write now, every subcommand has its section, and every knob of the
default config and of every shipped option has its row, with a description."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from omegaconf import OmegaConf

from pipeline.cli.commands import COMMANDS
from pipeline.cli.main import FLAGS
from pipeline.config.app import configs
from pipeline.config.compose import composed
from pipeline.config.sources import shipped_options

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "docs" / "tools"


@pytest.fixture(scope="module")
def tools() -> Iterator[dict[str, ModuleType]]:
    """Both generators, imported as their scripts run (config_page imports cli_page)."""
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(TOOLS))
        for name in ("cli_page", "config_page"):
            spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
            assert spec is not None and spec.loader is not None
            found[name] = importlib.util.module_from_spec(spec)
            patch.setitem(sys.modules, name, found[name])  # its dataclasses look it up
            spec.loader.exec_module(found[name])
        yield found


@pytest.fixture(scope="module")
def pages(tools: dict[str, ModuleType]) -> dict[str, str]:
    """Each page as its generator writes it now, and as committed."""
    found = {}
    for name, module in tools.items():
        found[f"{name} new"] = module.page()
        found[f"{name} committed"] = (ROOT / module.PAGE).read_text()
    return found


@pytest.fixture(scope="module")
def values(tools: dict[str, ModuleType]) -> dict[str, dict[str, dict]]:
    """Group -> option -> its composed section."""
    return tools["config_page"].option_values()[0]


@pytest.mark.parametrize("name", ["cli_page", "config_page"])
def test_the_committed_page_is_what_its_generator_writes(pages: dict[str, str], name: str) -> None:
    assert pages[f"{name} new"] == pages[f"{name} committed"], f"run python docs/tools/{name}.py"


@pytest.mark.parametrize("name", ["cli_page", "config_page"])
def test_a_page_names_no_path_of_this_machine_and_no_date(pages: dict[str, str], name: str) -> None:
    text = pages[f"{name} new"]
    assert str(ROOT) not in text and str(Path.home()) not in text
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)


def test_check_prints_a_diff_and_fails_only_when_the_page_is_stale(
    tools: dict[str, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_or_check = tools["cli_page"].write_or_check
    page = tmp_path / "page.md"
    assert write_or_check(page, "old\n", "gen.py", False) == 0
    assert write_or_check(page, "old\n", "gen.py", True) == 0
    assert capsys.readouterr().out == ""
    assert write_or_check(page, "new\n", "gen.py", True) == 1
    out, err = capsys.readouterr()
    assert "-old\n+new\n" in out and "run python gen.py" in err
    assert page.read_text() == "old\n"


def test_every_subcommand_and_flag_is_on_the_cli_page(pages: dict[str, str]) -> None:
    text = pages["cli_page committed"]
    headings = re.findall(r"^## (\S+)$", text, re.M)
    assert [h for h in headings if h in {*COMMANDS, "store"}] == [*COMMANDS, "store"]
    for name in [*COMMANDS, "store"]:
        assert f"$ hicache-pipeline {name} --help\nusage: hicache-pipeline {name} " in text
    for flag in re.findall(r"\[(--[a-z-]+)", FLAGS):
        assert re.search(rf"^- `{flag}\b", text, re.M), flag


def keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a composed config, sections included (not into lists)."""
    for key, value in node.items():
        yield prefix + key
        if isinstance(value, dict):
            yield from keys(value, f"{prefix}{key}.")


def knob_rows(text: str) -> dict[str, list[str]]:
    """Knob -> the cells of its row on the configuration page."""
    return {
        m.group(1): [cell.strip() for cell in re.split(r"(?<!\\)\|", m.group(2))]
        for m in re.finditer(r"^\| `([a-z_.0-9]+)` \|(.*)\|$", text, re.M)
    }


def test_every_knob_of_every_shipped_option_has_a_described_row(
    values: dict[str, dict[str, dict]], pages: dict[str, str]
) -> None:
    rows = knob_rows(pages["config_page committed"])
    with configs(None):
        default = OmegaConf.to_container(composed([]), resolve=True)
    assert isinstance(default, dict)
    found = {key for key in keys(default) if not isinstance(default.get(key), dict)}
    for group, options in values.items():
        for section in options.values():
            found |= {f"{group}.{key}" for key in keys(section)}
    assert "model.indexer.row_bytes" in found and "strict" in found  # the walk sees them
    assert sorted(found - rows.keys()) == []
    assert [knob for knob in found if len(rows[knob]) != 4 or "" in rows[knob]] == []


def test_every_shipped_option_has_its_row(pages: dict[str, str]) -> None:
    text = pages["config_page committed"]
    for group, options in shipped_options().items():
        section = text.split(f"\n## {group}\n")[1].split("\n## ")[0]
        for option in sorted(options):
            assert re.search(rf"^\| `{option}`( \\\*)? \| \S", section, re.M), (group, option)
