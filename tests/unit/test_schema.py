"""Every field of every config schema has an attribute docstring (the string under it)."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest

from pipeline import schema, topology

SCHEMAS = {
    schema: [
        "Config",
        "StrategyConfig",
        "PipelineConfig",
        "WorkloadConfig",
        "RuntimeConfig",
        "BenchConfig",
        "SimulateConfig",
        "IdleSyncSkipConfig",
    ],
    topology: ["ModelGeometry", "IndexerConfig", "Topology"],
}
CASES = [(module, name) for module, names in SCHEMAS.items() for name in names]


def documented_fields(source: str, class_name: str) -> tuple[list[str], list[str]]:
    """(every annotated field of the class, those followed by a string literal statement)."""
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    fields, documented = [], []
    for stmt, after in zip(cls.body, [*cls.body[1:], None], strict=True):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        fields.append(stmt.target.id)
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
            and after.value.value.strip()
        ):
            documented.append(stmt.target.id)
    return fields, documented


@pytest.mark.parametrize(("module", "class_name"), CASES, ids=[name for _, name in CASES])
def test_every_field_has_an_attribute_docstring(module, class_name: str) -> None:
    """The parse sees exactly the dataclass's fields, and each has a non-empty docstring."""
    fields, documented = documented_fields(inspect.getsource(module), class_name)
    cls = getattr(module, class_name)
    assert fields == [f.name for f in dataclasses.fields(cls)]
    missing = [f for f in fields if f not in documented]
    assert missing == [], f"{class_name} fields without a docstring: {missing}"


def test_group_schemas_are_all_checked() -> None:
    """Every schema'd config group's dataclass is in the list above."""
    checked = {getattr(m, n) for m, n in CASES}
    assert set(schema.GROUP_SCHEMAS.values()) <= checked
    assert schema.Config in checked


def test_checker_catches_a_missing_docstring() -> None:
    """The checker itself: a field followed by another field (or a number) is undocumented."""
    source = 'class C:\n    a: int = 1\n    """Doc."""\n    b: int = 2\n    c: int = 3\n    4\n'
    assert documented_fields(source, "C") == (["a", "b", "c"], ["a"])
