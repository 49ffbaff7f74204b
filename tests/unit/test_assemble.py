"""The closed door: only public stage classes of `stages/`, in a list their protocol fits, with
arguments that bind and fit their annotated types, can come out of a config."""

from __future__ import annotations

import sys
import types

import pytest

from pipeline.config.assemble import checked_entry
from stages.copy import Copy
from stages.verify import Verify


class Every:
    """A stage with a typed argument (stands in for any future stage that takes one)."""

    def __init__(self, *, every: int = 1) -> None:
        self.every = every

    def on_transfer(self, t: object, stream: object) -> None: ...


@pytest.fixture
def typed_stage(monkeypatch: pytest.MonkeyPatch) -> str:
    """`Every` as if it were defined in a module of the stages package."""
    module = types.ModuleType("stages.every_for_test")
    Every.__module__ = module.__name__
    module.Every = Every  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return f"{module.__name__}.Every"


def test_the_shipped_stages_pass() -> None:
    assert checked_entry({"_target_": "stages.copy.Copy"}, "per_step") == (Copy, {})
    assert checked_entry({"_target_": "stages.verify.Verify"}, "finish") == (Verify, {})


@pytest.mark.parametrize(
    ("entry", "list_name", "message"),
    [
        ({"_target_": "os.system", "command": "x"}, "finish", "lies outside the 'stages'"),
        ({"_target_": "stagesx.copy.Copy"}, "per_step", "lies outside the 'stages'"),
        ({"_target_": "stages.copy.Direction"}, "per_step", "not name a class defined in"),
        ({"_target_": "stages.copy.__class__"}, "per_step", "names a private name"),
        ({"_target_": "stages.copy._Dma"}, "per_step", "names a private name"),
        ({"_target_": "stages.copy.torch"}, "per_step", "not name a class defined in"),
        ({"_target_": "stages.nope.Copy"}, "per_step", "does not name a stage"),
        ({"_target_": "stages.copy.Copy"}, "prepare", "not a stage for the prepare list"),
        ({"_target_": "stages.verify.Verify"}, "exchange", "not a stage for the exchange list"),
        ({"_target_": "stages.copy.Copy", "x": 1}, "per_step", "do not fit stages.copy.Copy"),
        ({"_target_": 3}, "per_step", "must be a dotted name"),
        ({"target": "stages.copy.Copy"}, "per_step", "must be a mapping with a _target_"),
        ("stages.copy.Copy", "per_step", "must be a mapping with a _target_"),
    ],
)
def test_everything_else_is_refused(entry, list_name: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        checked_entry(entry, list_name)


def test_arguments_must_fit_their_annotated_types(typed_stage: str) -> None:
    assert checked_entry({"_target_": typed_stage, "every": 3}, "finish")[1] == {"every": 3}
    for bad in ("abc", 1.5, True, {"_target_": "os.getcwd"}, [1]):
        with pytest.raises(ValueError, match=r"every=.* is not an int"):
            checked_entry({"_target_": typed_stage, "every": bad}, "finish")
