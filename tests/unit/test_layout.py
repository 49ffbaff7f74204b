"""The layout shows the architecture, and stays that way: layers import only downward, and so
do the engine's rooms; only the config layer knows Hydra, no module or function outgrows a
sitting, every public class says what it is, and code comments carry no benchmark numbers."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "pipeline").rglob("*.py"), *(ROOT / "stages").glob("*.py")])
LAYERS = {
    "pipeline.core": 0,
    "pipeline.engine": 1,
    "stages": 2,
    "pipeline.config": 3,
    "pipeline.jobs": 4,
    "pipeline.cli": 5,
    "pipeline.api": 5,
    "pipeline.integrations": 5,
    "pipeline.__main__": 6,
}
"""Each package's layer: a module imports only from its own layer or below."""
ROOMS = {
    "cuda": {"cuda"},
    "transfer": {"cuda", "transfer"},
    "l3": {"cuda", "transfer", "l3", "runtime", "acks", "strategy"},
}
"""What each room of `pipeline/engine/` may import of the engine: its own room and those below
it; the L3 tier also the runtime, ack ledger and strategy it runs on. No room imports the
Engine API (`engine`, `factory`), which sits on top of them all."""
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def place_in_engine(module: str) -> str | None:
    """`pipeline.engine.l3.tier` -> `l3` (a room), `pipeline.engine.runtime` -> `runtime`."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["pipeline", "engine"] and len(parts) > 2 else None


def layer_of(module: str) -> int | None:
    for package, layer in LAYERS.items():
        if module == package or module.startswith(package + "."):
            return layer
    return None


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [module_name(p) for p in SOURCES if layer_of(module_name(p)) is None]
    assert unplaced == ["pipeline"]  # the package: its public names, imported on first use
    assert imports(ROOT / "pipeline" / "__init__.py") <= {"__future__", "importlib", "typing"}


def test_the_public_names_resolve_to_their_homes() -> None:
    import pipeline
    from pipeline import api
    from pipeline.config.job import Job
    from pipeline.engine.engine import Engine
    from pipeline.engine.l3.store_view import StoreView
    from pipeline.engine.transfer.executor import LoadHandle

    assert (pipeline.compose, pipeline.create_engine) == (api.compose, api.create_engine)
    assert (pipeline.page_keys, pipeline.open_store) == (api.page_keys, api.open_store)
    assert (pipeline.Engine, pipeline.LoadHandle, pipeline.Job) == (Engine, LoadHandle, Job)
    assert pipeline.StoreView is StoreView
    assert sorted(pipeline.__all__) == [
        "Engine",
        "Job",
        "LoadHandle",
        "StoreView",
        "compose",
        "create_engine",
        "open_store",
        "page_keys",
    ]


def test_imports_go_downward_only() -> None:
    upward = []
    for path in SOURCES:
        here = module_name(path)
        for imported in imports(path):
            theirs = layer_of(imported)
            if theirs is not None and theirs > (layer_of(here) or 0):
                upward.append(f"{here} imports {imported}")
    assert upward == []


def test_the_engine_rooms_import_only_their_own_and_lower_rooms() -> None:
    crossing = []
    for path in SOURCES:
        here = place_in_engine(module_name(path))
        for imported in imports(path) if here in ROOMS else ():
            theirs = place_in_engine(imported)
            if theirs is not None and theirs not in ROOMS[here]:
                crossing.append(f"{module_name(path)} imports {imported}")
    assert crossing == []


def test_stages_see_the_engine_rooms_only() -> None:
    """A stage imports of the engine only its rooms (copy calls and streams, a transfer's
    state, the L3 tier), never the Engine API or its lifetime: stages run in unit tests with
    fakes, no engine made."""
    offenders = [
        f"{module_name(p)} imports {m}"
        for p in SOURCES
        if module_name(p).startswith("stages")
        for m in imports(p)
        if place_in_engine(m) not in (None, *ROOMS)
    ]
    assert offenders == []


def test_no_import_cycles() -> None:
    names = {module_name(p) for p in SOURCES}
    graph = {
        module_name(p): {m for m in imports(p) if m in names and m != module_name(p)}
        for p in SOURCES
    }
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, node])):
                return cycle
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state:
            assert visit(start, []) == []


def test_only_the_engine_factory_builds_engines_and_sizes_pools() -> None:
    """`Engine(...)` is called in `pipeline.engine.factory` alone, and `HostCapacity` /
    `Sizing` are made by `core.sizing` alone: one factory, one sizing, whatever the caller
    (API, jobs, benches, tests)."""
    homes = {"Engine": "pipeline.engine.factory", "Sizing": "pipeline.core.sizing"}
    homes["HostCapacity"] = "pipeline.core.sizing"
    scripts = [*(ROOT / "examples").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    everything = [*SOURCES, *(ROOT / "tests").rglob("*.py"), *scripts]
    offenders = []
    for path in everything:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                home = homes.get(node.func.id)
                if home is not None and module_name(path) != home:
                    offenders.append(f"{module_name(path)}:{node.lineno} calls {node.func.id}")
    assert offenders == []


def test_only_the_config_layer_imports_hydra_or_omegaconf() -> None:
    offenders = [
        f"{module_name(p)} imports {m}"
        for p in SOURCES
        if not module_name(p).startswith("pipeline.config")
        for m in imports(p)
        if m.split(".")[0] in ("hydra", "omegaconf")
    ]
    assert offenders == []


def test_the_engine_and_every_stage_load_without_hydra() -> None:
    """Importing the engine, the core layer and every stage leaves Hydra and OmegaConf out of
    `sys.modules` (a fresh interpreter, so nothing else imported them first)."""
    modules = [
        module_name(p)
        for p in SOURCES
        if layer_of(module_name(p)) in (LAYERS["pipeline.core"], LAYERS["pipeline.engine"], 2)
    ]
    assert "pipeline.engine.engine" in modules and "stages.copy" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_modules_and_functions_fit_a_sitting(path: Path) -> None:
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_public_classes_say_what_they_are(path: Path) -> None:
    undocumented = [
        node.name
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and not node.name.startswith("_")
        and not ast.get_docstring(node)
    ]
    assert undocumented == []


MEASUREMENT = re.compile(r"\d+(\.\d+)?\s*(us|µs|ms|GB/s|MB/s)\b")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_comments_carry_no_benchmark_numbers(path: Path) -> None:
    """Timings belong in BENCHMARKS.md, where the command that made them stands beside them."""
    text = path.read_text()
    comments = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT
    ]
    docstrings = [
        ast.get_docstring(node) or ""
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    assert [c for c in comments + docstrings if MEASUREMENT.search(c)] == []
