"""examples/ shows what a serving engine may write: `import pipeline` and the engine's documented
calls, nothing of the package's insides (measurement probes live in benchmarks/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
ENGINE_API = (ROOT / "docs" / "engine-api.md").read_text() + (ROOT / "README.md").read_text()
DOCUMENTED = {a or b for a, b in re.findall(r"engine\.(\w+)|`(\w+)(?:\(|`)", ENGINE_API)}
"""Every `engine.<name>`, and every call or name in backticks, that the engine API's page and
the README show."""


def engine_attributes(tree: ast.AST) -> set[str]:
    """The names an example reads off a variable called `engine` (or `e`)."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("engine", "e")
    }


def private_imports(tree: ast.AST) -> list[str]:
    """Imports of the package's modules rather than its front door (`import pipeline`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline"):
            found.append(f"from {node.module} import ...")
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith(("pipeline.", "stages"))]
    return found


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_an_example_uses_only_the_public_documented_api(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert private_imports(tree) == []
    assert engine_attributes(tree) - DOCUMENTED == set()


def test_the_probes_left_examples_for_benchmarks() -> None:
    names = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    assert {"probe_reads.py", "probe_cuda_calls.py", "profile_issue.py"} <= names
    assert not any(p.name.startswith(("probe_", "profile_")) for p in EXAMPLES)
