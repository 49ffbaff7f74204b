"""Every field of every config schema has an attribute docstring (the string under it)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from pipeline.config import drive_schemas, schema
from pipeline.config.schema import BenchConfig, RuntimeConfig, SimulateConfig, WorkloadConfig
from pipeline.core import events, model, storage, strategy, topology
from pipeline.core.checks import ConfigError
from pipeline.core.ownership import Ownership
from pipeline.core.strategy import IdleSyncSkipConfig, StrategyConfig

SCHEMAS = {
    schema: [
        "Config",
        "WorkloadConfig",
        "RuntimeConfig",
    ],
    drive_schemas: ["BenchConfig", "SimulateConfig", "SoakConfig"],
    strategy: ["StrategyConfig", "PipelineConfig", "IdleSyncSkipConfig"],
    model: ["ModelGeometry", "IndexerConfig"],
    topology: ["Topology"],
    storage: ["StorageConfig"],
    events: ["EventsConfig"],
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


KNOB_ERRORS = [
    (StrategyConfig, {"chunk_pages": -1}, "strategy.chunk_pages=-1 must be >= 0"),
    (StrategyConfig, {"staging_bytes": 0}, "strategy.staging_bytes=0 must be >= 1"),
    (StrategyConfig, {"verify_every": -2}, "strategy.verify_every=-2 must be >= 0"),
    (StrategyConfig, {"poll_timer_every": -1}, "strategy.poll_timer_every=-1 must be >= 0"),
    (StrategyConfig, {"cuda_graph_cache": -1}, "strategy.cuda_graph_cache=-1 must be >= 0"),
    (
        StrategyConfig,
        {"idle_sync_skip": IdleSyncSkipConfig(max_skips=0)},
        "strategy.idle_sync_skip.max_skips=0 must be >= 1",
    ),
    (WorkloadConfig, {"cycles": 0}, "workload.cycles=0 must be >= 1"),
    (WorkloadConfig, {"host_ratio": 0.0}, "workload.host_ratio=0.0 must be > 0"),
    (RuntimeConfig, {"timeout_s": 0.0}, "runtime.timeout_s=0.0 must be > 0"),
    (BenchConfig, {"repeats": 0}, "bench.repeats=0 must be >= 1"),
    (BenchConfig, {"chunk_pages": [0, -3]}, r"bench.chunk_pages=\[0, -3\] must hold integers"),
    (SimulateConfig, {"max_skips": 0}, "simulate.max_skips=0 must be >= 1"),
    (SimulateConfig, {"arrive_prob": 1.5}, r"simulate.arrive_prob=1.5 must lie in \[0, 1\]"),
    (BenchConfig, {"new_tokens": [0]}, r"bench.new_tokens=\[0\] must hold integers >= 1"),
    (RuntimeConfig, {"metrics_port": 0}, r"runtime.metrics_port=0 must lie in \[1, 65535\]"),
    (storage.StorageConfig, {"min_hit_pages": 0}, "storage.min_hit_pages=0 must be >= 1"),
    (
        storage.StorageConfig,
        {"prefetch_timeout_s": 0.0},
        "storage.prefetch_timeout_s=0.0: seconds, > 0",
    ),
    (storage.StorageConfig, {"admit_after_hits": 0}, "storage.admit_after_hits=0 must be >= 1"),
    (events.EventsConfig, {"endpoint": "ipc:///tmp/x"}, "events.endpoint='ipc:///tmp/x': tcp://"),
    (events.EventsConfig, {"replay_endpoint": "tcp://h"}, "events.replay_endpoint='tcp://h': tcp"),
    (
        events.EventsConfig,
        {"replay_endpoint": "tcp://127.0.0.1:5557"},
        "events.replay_endpoint: another port than events.endpoint",
    ),
    (events.EventsConfig, {"buffer_steps": 0}, "events.buffer_steps=0 must be >= 1"),
]
REQUIRED = {
    StrategyConfig: {"name": "s", "ownership": Ownership.replicated},
    WorkloadConfig: {"num_tokens": 8, "device_tokens": 64},
}


@pytest.mark.parametrize(("schema_class", "knobs", "message"), KNOB_ERRORS)
def test_every_knob_is_range_checked_where_it_lives(schema_class, knobs, message) -> None:
    """A knob's range check is in its dataclass, so any config that builds it (validate, a
    job, a test) gets the same error naming the key."""
    with pytest.raises(ValueError, match=message):
        schema_class(**REQUIRED.get(schema_class, {}), **knobs)


def test_no_shipped_stage_entry_carries_an_argument() -> None:
    """Every knob has one home: a stage entry names its stage and nothing else, so no
    `${strategy.*}` copy (or any other value) can shadow a strategy knob."""
    strategies = sorted((Path(__file__).parents[2] / "conf" / "strategy").glob("*.yaml"))
    assert {p.stem for p in strategies} == {"replicated", "single_source", "rotating", "auto"}
    for path in strategies:
        config = yaml.safe_load(path.read_text())
        for direction in ("backup", "load"):  # a file may take its lists from another's
            for entries in config.get(direction, {}).values():
                assert all(list(entry) == ["_target_"] for entry in entries), path
        assert "${" not in path.read_text(), path


def test_one_object_reports_all_its_problems_at_once() -> None:
    """A knob's mistake does not hide another's: the error holds every problem."""
    with pytest.raises(ConfigError) as raised:
        StrategyConfig(
            name="s",
            ownership=Ownership.rotating,
            chunk_pages=-1,
            staging_bytes=0,
            idle_sync_skip=IdleSyncSkipConfig(max_skips=0),
        )
    keys = [p.key for p in raised.value.problems]
    assert keys == [
        "strategy.chunk_pages",
        "strategy.staging_bytes",
        "strategy.idle_sync_skip.max_skips",
    ]


def test_a_workload_beyond_any_engine_is_refused_naming_each_key() -> None:
    """64M tokens made `plan` take 95 s and 7 GB; 2**24 tokens per pool is the most."""
    WorkloadConfig(num_tokens=1 << 23, device_tokens=1 << 24)
    with pytest.raises(ConfigError) as refused:
        WorkloadConfig(num_tokens=1 << 26, device_tokens=1 << 27)
    said = str(refused.value)
    assert "workload.num_tokens=67108864: at most 16777216" in said
    assert "workload.device_tokens=134217728: at most 16777216" in said
