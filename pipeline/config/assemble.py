"""StrategyConfig -> Strategy: stage lists instantiated from `_target_` entries, behind a door.

A config must not be able to run arbitrary code. A `_target_` must name a public class defined
in a module of the `stages` package that implements the protocol of its list (`on_transfer`
for prepare and finish, `on_step` for per_step and exchange, `on_objects` for the L3 lists);
nothing outside `stages` is imported to find out, and the entry's arguments must bind to the
class's signature. An L3 fetch must agree on hits after reading, and a deduplicated one on
its plan before (else ranks could load different pages and their broadcasts would not match).
`stage_problems` reports every problem of a strategy; `assemble` raises on the first.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.config.schema_check import value_problems
from pipeline.core.checks import Problem
from pipeline.core.ownership import Ownership
from pipeline.core.strategy import StrategyConfig
from pipeline.engine.l3.tier import ObjectStage
from pipeline.engine.strategy import L3Pipeline, Strategy
from pipeline.engine.transfer import Pipeline, StepStage, TransferStage

STAGE_PACKAGE = "stages"
LIST_PROTOCOLS: Mapping[str, type] = {
    "prepare": TransferStage,
    "per_step": StepStage,
    "exchange": StepStage,
    "finish": TransferStage,
    "write_back": ObjectStage,
    "fetch": ObjectStage,
}
"""Which protocol a stage in each list must implement."""
METHODS: Mapping[type, str] = {
    TransferStage: "on_transfer",
    StepStage: "on_step",
    ObjectStage: "on_objects",
}
FETCH_ORDER = {
    "read": "stages.read_objects.ReadObjects",
    "hits": "stages.agree_on_hits.AgreeOnHits",
    "plan": "stages.agree_on_plan.AgreeOnPlan",
}


def check_own_stages() -> None:
    """ValueError unless `stages` is this project's own package (the folder beside the
    `pipeline` package): a `stages/` folder in the current directory, or anywhere earlier on
    sys.path, would otherwise be imported (and its `__init__` run) in its place. Checked
    before it is imported."""
    own = Path(__file__).resolve().parents[2] / STAGE_PACKAGE / "__init__.py"
    loaded = sys.modules.get(STAGE_PACKAGE)
    origin = loaded.__file__ if loaded is not None else None
    if loaded is None:
        spec = importlib.util.find_spec(STAGE_PACKAGE)
        origin = spec.origin if spec is not None else None
    if origin is None or Path(origin).resolve() != own:
        raise ValueError(
            f"the '{STAGE_PACKAGE}' package found first is {origin}, not this project's "
            f"({own.parent}): a folder of that name shadows it (run from another folder, or "
            "use the installed hicache-pipeline command)"
        )


def stage_class(target: Any, list_name: str) -> type:
    """The stage class a `_target_` names; ValueError for anything else."""
    if not isinstance(target, str):
        raise ValueError(f"_target_ {target!r} must be a dotted name of a stage class")
    module_name, _, class_name = target.rpartition(".")
    if not module_name.startswith(STAGE_PACKAGE + "."):
        raise ValueError(
            f"_target_ {target!r} lies outside the '{STAGE_PACKAGE}' package; "
            "configs may only name stages"
        )
    if class_name.startswith("_"):
        raise ValueError(f"_target_ {target!r} names a private name; configs name stage classes")
    check_own_stages()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"_target_ {target!r} does not name a stage: {e}") from e
    cls = vars(module).get(class_name)
    if not inspect.isclass(cls) or cls.__module__ != module_name:
        raise ValueError(f"_target_ {target!r} does not name a class defined in {module_name}")
    protocol = LIST_PROTOCOLS[list_name]
    if not issubclass(cls, protocol):
        raise ValueError(
            f"_target_ {target!r} is not a stage for the {list_name} list (it has no "
            f"{METHODS[protocol]})"
        )
    return cls


def checked_entry(entry: Any, list_name: str) -> tuple[type, dict[str, Any]]:
    """(class, keyword arguments) of one stage entry, bound to the class (constructs nothing)."""
    if not isinstance(entry, Mapping) or "_target_" not in entry:
        raise ValueError(f"stage entry {entry!r} must be a mapping with a _target_")
    kwargs = {str(k): v for k, v in entry.items() if k != "_target_"}
    cls = stage_class(entry["_target_"], list_name)
    signature = inspect.signature(cls, eval_str=True)
    try:
        signature.bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"arguments {sorted(kwargs)} do not fit {entry['_target_']}: {e}") from e
    hints = {
        name: Any if p.annotation is inspect.Parameter.empty else p.annotation
        for name, p in signature.parameters.items()
    }
    wrong = [p.message for k, v in kwargs.items() for p in value_problems(v, hints[k], k)]
    if wrong:
        raise ValueError(f"arguments do not fit {entry['_target_']}: {'; '.join(wrong)}")
    return cls, kwargs


def assemble(config: StrategyConfig) -> Strategy:
    """The strategy with its stages instantiated (raises on the first bad entry)."""
    l3 = dataclasses.asdict(config.l3)
    return Strategy(
        config,
        Pipeline(**_built(dataclasses.asdict(config.backup))),
        Pipeline(**_built(dataclasses.asdict(config.load))),
        L3Pipeline(**_built(l3)),
    )


def _built(lists: Mapping[str, list[Any]]) -> dict[str, tuple[Any, ...]]:
    """Each list's stages, instantiated."""
    built = {}
    for list_name, entries in lists.items():
        stages = []
        for entry in entries:
            cls, kwargs = checked_entry(entry, list_name)
            stages.append(cls(**kwargs))
        built[list_name] = tuple(stages)
    return built


def stage_problems(
    directions: Mapping[str, Mapping[str, list[Any]]], ownership: Ownership | None
) -> list[Problem]:
    """Every stage problem of a strategy's plain `{direction: {list: [entries]}}` data (its
    ownership: None where it has none, a problem reported elsewhere)."""
    found = []
    for direction, lists in directions.items():
        for list_name in LIST_PROTOCOLS:
            for i, entry in enumerate(lists.get(list_name, [])):
                key = f"strategy.{direction}.{list_name}[{i}]"
                try:
                    checked_entry(entry, list_name)
                except ValueError as e:
                    found.append(Problem(key, f"{key}: {e}"))
    fetch = directions.get("l3", {}).get("fetch", [])
    broken = {p.key.rpartition("[")[0] for p in found}  # a list whose entries are wrong may
    lacking = [p for p in required_problems(directions, ownership) if p.key not in broken]
    return found + fetch_problems(fetch, ownership) + lacking  # lack what they meant to name


COPY, ACK = "stages.copy.Copy", "stages.record_event.RecordEvent"
REQUIRED: Mapping[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("backup", "per_step"): ((COPY,), "nothing would be copied"),
    ("backup", "finish"): ((ACK,), "the backup would never ack"),
    ("load", "per_step"): ((COPY,), "nothing would be copied"),
    ("load", "finish"): ((ACK,), "the load would never ack"),
    ("l3", "write_back"): (("stages.write_objects.WriteObjects",), "nothing would reach L3"),
    ("l3", "fetch"): (
        ("stages.read_objects.ReadObjects",),
        "a fetch would report pages it never read as hits",
    ),
}
"""What every strategy's lists must hold to move its bytes, and what would go wrong without."""
EXCHANGED = (
    ("stages.gather.Gather", "stages.broadcast.Broadcast", "stages.scatter.Scatter", ACK),
    "a layer would never reach the peers, or never be usable there",
)
"""What a deduplicated load's exchange must hold."""


def required_problems(
    directions: Mapping[str, Mapping[str, list[Any]]], ownership: Ownership | None
) -> list[Problem]:
    """Each stage a strategy's ownership needs that its lists lack, naming the list."""
    needed = dict(REQUIRED)
    if ownership in (Ownership.single_source, Ownership.rotating):
        needed["load", "exchange"] = EXCHANGED
    found = []
    for (direction, list_name), (stages, why) in needed.items():
        entries = directions.get(direction, {}).get(list_name, [])
        targets = {e.get("_target_") for e in entries if isinstance(e, Mapping)}
        key = f"strategy.{direction}.{list_name}"
        found += [Problem(key, f"{key} lacks {s}: {why}") for s in stages if s not in targets]
    return found


def fetch_problems(entries: list[Any], ownership: Ownership | None) -> list[Problem]:
    """A fetch that reads must agree on hits after its read, and (deduplicated) on its plan
    before it."""
    targets = [e.get("_target_") if isinstance(e, Mapping) else None for e in entries]
    if FETCH_ORDER["read"] not in targets:
        return []
    read = targets.index(FETCH_ORDER["read"])
    needed = [("hits", read + 1, len(targets), "after")]
    if ownership in (Ownership.single_source, Ownership.rotating):
        needed.append(("plan", 0, read, "before"))
    return [
        Problem(
            "strategy.l3.fetch",
            f"strategy.l3.fetch: {FETCH_ORDER[name]} must come {where} {FETCH_ORDER['read']} "
            "(a deduplicated fetch, or any that reads): ranks would otherwise load different pages",
        )
        for name, first, end, where in needed
        if FETCH_ORDER[name] not in targets[first:end]
    ]


def stage_name(stage: object) -> str:
    """A stage's name as the config file names its module (e.g. 'copy')."""
    return type(stage).__module__.rpartition(".")[2]
