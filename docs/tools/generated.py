"""What the docs generators share: a class's attribute docstrings, and writing a generated file
or (`--check`) showing how the committed one differs."""

from __future__ import annotations

import ast
import difflib
import inspect
import itertools
import sys
from pathlib import Path


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it), on one line."""
    (tree,) = ast.parse(inspect.getsource(cls)).body
    assert isinstance(tree, ast.ClassDef)
    return {
        stmt.target.id: " ".join(after.value.value.split())
        for stmt, after in itertools.pairwise(tree.body)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        if isinstance(after.value.value, str)
    }


def write_or_check(path: Path, text: str, generator: str, check: bool) -> int:
    """Write the file, or (`check`) print how the committed one differs: 1 if it does."""
    if not check:
        path.write_text(text)
        return 0
    old = path.read_text() if path.is_file() else ""
    diff = list(
        difflib.unified_diff(
            old.splitlines(True), text.splitlines(True), str(path), f"{path} (regenerated)"
        )
    )
    if diff:
        sys.stdout.writelines(diff)
        print(f"\n{path} is stale: run python {generator}", file=sys.stderr)
    return 1 if diff else 0
