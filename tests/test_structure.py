"""The shape of the code, checked on the source: no import circles, no long functions."""

import ast
from pathlib import Path

import networkx as nx
import pytest

from .helpers import PACKAGES

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600  # issue #30: a module one reads in a sitting
MAX_CLASS_METHODS = 25  # ... and a class with one job
# Long by nature: a flat list of declarations, and the decoder that checks a frame field by field.
LONG_ALLOWED = {("p2pnode_cli/testnet.py", "add_parser"), ("protocol/envelope.py", "decode")}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file: at the top, inside functions,
    or for type checking only; `from package import name` counts as importing the submodule
    `package.name` if there is one, else the package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in targets if target in known and target != module}


def test_there_is_no_import_circle():
    known = modules()
    graph = nx.DiGraph()
    for module, path in known.items():
        graph.add_node(module)
        graph.add_edges_from((module, target) for target in imported(module, path, set(known)))
    # A package's __init__ re-exports its own submodules; a submodule importing its package back
    # (e.g. `from protocol import X` inside protocol/) would close a circle through it.
    cycles = list(nx.simple_cycles(graph))
    assert cycles == [], [" → ".join([*cycle, cycle[0]]) for cycle in cycles[:5]]
    assert graph.has_edge("p2pnode.node", "p2pnode.learning.driver")  # the graph is real: a known edge is in it
    assert not nx.has_path(graph, "p2pnode.learning.driver", "p2pnode.node")


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for path in modules().values():
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and (relative, node.name) not in LONG_ALLOWED:
                    long.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], long


def calls_of(name: str) -> list[str]:
    """Where the project's code outside tests calls `name(...)` (a plain or dotted name)."""
    found = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if called == name:
                    found.append(path.relative_to(ROOT).as_posix())
    return found


def test_a_runs_data_is_one_object_written_and_read_in_one_place():
    """algorithms/data/setup.py:ScenarioSpec says what a run's data is, and alone cuts its partition;
    the CLI and a fleet's rehearsal build it, the testnet writes each daemon's `[data]` from it in one
    place (`data_table`) and a daemon reads it back in one (`DataSettings.scenario_spec`), so daemon i
    and simulated node i are dealt the same data."""
    assert set(calls_of("PartitionSpec")) == {"algorithms/data/setup.py"}
    assert set(calls_of("data_table")) == {"testnet/launch/learning.py"}
    assert set(calls_of("scenario_spec")) == {"p2pnode/learning/algorithm.py", "testnet/simulation/rehearsal.py"}
    built = {path for path in calls_of("ScenarioSpec") if not path.startswith("tools/")}  # a benchmark's own runs
    assert built == {"p2pnode/learning/settings.py", "p2pnode_cli/scenario.py", "testnet/simulation/rehearsal.py"}


def test_the_algorithms_are_listed_once():
    """algorithms/catalog.py lists them (importable without torch); the registry loads each
    entry's class from there and names none itself."""
    registry = ast.parse((ROOT / "algorithms" / "registry.py").read_text())
    imported = {node.module for node in ast.walk(registry) if isinstance(node, ast.ImportFrom)}
    assert not any(module and "methods" in module for module in imported), imported
    assert "mapl-dual" not in (ROOT / "algorithms" / "registry.py").read_text()


def test_no_module_is_longer_than_six_hundred_lines():
    long = {}
    for path in modules().values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            long[path.relative_to(ROOT).as_posix()] = lines
    assert long == {}, f"split these by job: {long}"


def test_no_class_has_more_than_twenty_five_methods():
    big = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)
                if methods > MAX_CLASS_METHODS:
                    big.append(f"{path.relative_to(ROOT).as_posix()} {node.name} ({methods} methods)")
    assert big == [], big


def test_no_test_module_imports_another():
    """What several test modules share lives in tests/helpers.py (issue #47): a test module that
    imports another runs that one's module-level code and hides where a helper is."""
    importing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level
                and (node.module or "").split(".")[-1].startswith("test_")
            ):
                importing.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert importing == []
