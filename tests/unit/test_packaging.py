"""What installing the project puts on a machine: its license, its packages, and shipped configs
that a user's own `conf/` folder (every Hydra project has one) never shadows."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.sources import SHIPPED, shipped_root

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_project_is_apache_2_licensed_in_its_file_metadata_and_readme() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert importlib.metadata.metadata("hicache-pipeline")["License-Expression"] == "Apache-2.0"
    assert "[Apache License 2.0](LICENSE)" in (ROOT / "README.md").read_text()


def test_every_package_is_listed_and_no_top_level_conf_is_installed() -> None:
    """The package list is explicit (for the `pipeline.conf` mapping): every folder of modules
    under pipeline/ and stages/ is in it, and the configs go in under the package's name."""
    tool = PYPROJECT["tool"]["setuptools"]
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("pipeline", "stages")
        for p in (ROOT / top).rglob("*.py")
    }
    assert set(tool["packages"]) == folders | {SHIPPED}
    assert tool["package-dir"] == {SHIPPED: "conf"}
    assert shipped_root() == ROOT / "conf"


@pytest.fixture
def own_conf(tmp_path: Path) -> Path:
    """A user's project folder with a `conf/` of its own: a package that would fail if imported,
    its own config.yaml and an option the shipped tree does not have."""
    conf = tmp_path / "conf"
    (conf / "strategy").mkdir(parents=True)
    (conf / "__init__.py").write_text("raise RuntimeError('the user conf/ was imported')\n")
    (conf / "config.yaml").write_text("defaults:\n  - strategy: mine\n")
    (conf / "strategy" / "mine.yaml").write_text("name: mine\nunknown_key: 1\n")
    return tmp_path


def in_folder(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` run from `folder`, which Python puts first on the import path."""
    run = [sys.executable, *args]
    return subprocess.run(run, capture_output=True, text=True, cwd=folder, timeout=120)


def test_list_reads_the_shipped_configs_from_a_folder_with_its_own_conf(own_conf: Path) -> None:
    done = in_folder(own_conf, "-m", "pipeline", "list")
    assert done.returncode == 0, done.stderr
    assert "rotating" in done.stdout and "deepseek_v3" in done.stdout
    assert "mine" not in done.stdout


def test_validate_takes_no_option_of_a_folders_own_conf_for_a_shipped_one(own_conf: Path) -> None:
    """What `validate` checks as shipped (running it whole costs a compose per option)."""
    shows = "from pipeline.config.sources import shipped_options; print(shipped_options())"
    done = in_folder(own_conf, "-c", shows)
    assert done.returncode == 0, done.stderr
    assert "'rotating'" in done.stdout and "mine" not in done.stdout
