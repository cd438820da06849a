"""The dependency rules of docs/architecture.md, checked on the source: who may import what."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import LAYERS, PACKAGES

ROOT = Path(__file__).resolve().parent.parent
IO_AND_CLOCKS = {"socket", "asyncio", "selectors", "subprocess", "time", "datetime", "trio", "zmq"}


def imports(path: Path) -> set[str]:
    """Top-level names of every absolute import in a file (relative imports stay in-package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def files(package: str):
    return sorted((ROOT / package).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def test_protocol_is_sans_io_and_imports_only_numpy_msgpack_cryptography():
    allowed = set(sys.stdlib_module_names) - IO_AND_CLOCKS - {"pickle", "marshal", "shelve"}
    allowed |= {"numpy", "msgpack", "cryptography", "protocol"}
    for path in files("protocol"):
        bad = {name for name in imports(path) if top(name) not in allowed}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_algorithms_do_no_io():
    forbidden = IO_AND_CLOCKS | {"threading", "p2pnode", "testnet"}
    for path in files("algorithms"):
        bad = {name for name in imports(path) if top(name) in forbidden}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_package_imports_one_above_it():
    for package, below in LAYERS.items():
        above = set(PACKAGES) - below - {package}
        for path in files(package):
            bad = {name for name in imports(path) if top(name) in above}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}, a layer above {package}"


@pytest.mark.parametrize("package", ["protocol", "p2pnode"])
def test_nothing_from_the_network_can_be_unpickled(package):
    for path in files(package):
        assert not {n for n in imports(path) if top(n) in {"pickle", "dill", "cloudpickle", "marshal", "shelve"}}, path


def test_importing_protocol_loads_no_torch_trio_or_zmq():
    code = "import protocol, sys; print(sorted(m for m in ('torch', 'trio', 'zmq') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# The rooms of testnet/ (testnet/__init__.py): each imports only those below it; a module at the
# top of testnet/ (ray_extra.py) sits below every room.
TESTNET_ROOMS = {"reporting": set(), "simulation": {"reporting"}, "launch": {"simulation", "reporting"}}


def rooms_imported_by(path: Path) -> set[str]:
    """The rooms of testnet/ a module of it imports (relative imports resolved; inside functions too)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    rooms = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            names = [(*base, *(node.module.split(".") if node.module else ()), alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        else:
            continue
        rooms.update(name[1] for name in names if name[0] == "testnet" and len(name) > 1 and name[1] in TESTNET_ROOMS)
    return rooms


def test_testnet_rooms_import_only_rooms_below():
    assert {path.parent.name for path in files("testnet")} == {"testnet", *TESTNET_ROOMS}, "a room without a rule"
    for path in files("testnet"):
        room = path.parent.name
        allowed = TESTNET_ROOMS.get(room, set()) | {room}
        bad = rooms_imported_by(path) - allowed
        assert not bad, f"{path.relative_to(ROOT)} imports testnet's {sorted(bad)}, not a room below {room}"
    assert rooms_imported_by(ROOT / "testnet" / "launch" / "learning.py") == {"launch", "simulation", "reporting"}


RAY_MODULES = {Path("testnet/simulation/rayhosts.py"), Path("testnet/launch/raynodes.py")}  # the engines' Ray sides
RAY_PROBE = Path("testnet/ray_extra.py")  # asks whether Ray is installed, importing it in a function


def test_ray_stays_optional_importing_every_module_loads_no_ray():
    """Ray is the optional extra of the `--engine ray` of `simulate` and `testnet`: only the two
    modules of RAY_MODULES import it, and only when that engine runs (RAY_PROBE tries to)."""
    paths = [p for pkg in PACKAGES for p in files(pkg) if p.relative_to(ROOT) not in RAY_MODULES]
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths]
    names = [n.removesuffix(".__init__") for n in names if not n.endswith("__main__")]
    code = f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\nprint('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    for path in paths:
        if path.relative_to(ROOT) != RAY_PROBE:
            assert "ray" not in {top(n) for n in imports(path)}, path


# Inside p2pnode (docs/architecture.md, "Inside the daemon"): each part imports only parts on
# floors below its own; a part is a sub-package or a top-level module.
P2PNODE_FLOORS = (
    {"exits", "files", "options", "forkserver"},
    {"metrics", "memory", "data_dir"},
    {"wire"},
    {"discovery"},
    {"learning", "relay"},
    {"operations"},
    {"config"},
    {"serving", "fleet"},
    {"node"},
    {"runner"},
)
FLOOR = {part: floor for floor, parts in enumerate(P2PNODE_FLOORS) for part in parts}


def p2pnode_imports(path: Path, *, types: bool = True, root: Path = ROOT) -> set[tuple[str, ...]]:
    """Every p2pnode name `path` imports, as its parts after `p2pnode` (relative imports resolved;
    inside functions too; `types`: under TYPE_CHECKING too)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    tree = ast.parse(path.read_text(), str(path))
    skipped = set()
    if not types:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(inner) for inner in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            target = (*base, *(node.module.split(".") if node.module else ()))
            names = [(*target, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        else:
            continue
        found.update(name[1:] for name in names if name[0] == "p2pnode" and len(name) > 1)
    return found


def upward_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The imports of `path` (a module of p2pnode under `root`) that are not of a floor below its part's."""
    parts = path.relative_to(root / "p2pnode").with_suffix("").parts
    mine = parts[0]
    if mine not in FLOOR:
        return [f"p2pnode/{mine} has no floor in P2PNODE_FLOORS: give it one"]
    bad = []
    for target in p2pnode_imports(path, root=root):
        theirs = target[0]
        if theirs not in (mine, "__init__") and not FLOOR.get(theirs, len(FLOOR)) < FLOOR[mine]:
            bad.append(f"imports p2pnode.{'.'.join(target)}: {theirs} is not on a floor below {mine}")
    return bad


def test_p2pnode_parts_import_only_parts_on_floors_below():
    for path in files("p2pnode"):
        if path.relative_to(ROOT / "p2pnode") != Path("__init__.py"):
            assert not upward_imports(path), f"{path.relative_to(ROOT)} {upward_imports(path)}"


PURE_MARK = "PURE = True"
READS_AND_WRITES = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "sleep"}
FORBIDDEN_IN_PURE = IO_AND_CLOCKS | {"os", "shutil", "threading", "signal", "fcntl", "tempfile"}


def pure_modules(root: Path = ROOT) -> set[tuple[str, ...]]:
    """The modules of p2pnode marked `PURE = True`, as their parts after `p2pnode`."""
    return {
        path.relative_to(root / "p2pnode").with_suffix("").parts
        for path in (root / "p2pnode").rglob("*.py")
        if f"\n{PURE_MARK}" in path.read_text()
    }


def impurities(path: Path, pure: set[tuple[str, ...]], root: Path = ROOT) -> list[str]:
    """What keeps a module marked pure from being so: an I/O or clock module imported, a call
    that opens, reads, writes or sleeps, or a p2pnode import (types aside) of a module that is
    neither pure nor settings nor options."""
    bad = [f"imports {name}" for name in imports(path) if top(name) in FORBIDDEN_IN_PURE]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in READS_AND_WRITES:
                bad.append(f"line {node.lineno} calls {name}")
    for target in p2pnode_imports(path, types=False, root=root):
        module = target if target in pure else target[:-1]
        if not (module in pure or module[-1:] == ("settings",) or module in (("options",), ("exits",))):
            bad.append(f"imports p2pnode.{'.'.join(target)}, which is not pure")
    return bad


def test_pure_modules_of_p2pnode_do_no_io_and_read_no_clock():
    """The modules marked `PURE = True` run the same on any clock the caller hands in."""
    pure = pure_modules()
    assert {("discovery", "peers"), ("learning", "engine"), ("learning", "rounds"), ("wire", "gate")} <= pure
    for parts in pure:
        path = ROOT / "p2pnode" / Path(*parts).with_suffix(".py")
        assert not impurities(path, pure), f"{path.relative_to(ROOT)}: {impurities(path, pure)}"


def test_the_layering_checks_catch_what_they_are_for(tmp_path):
    """The two checks above fail where they should: an import up a floor, a clock, I/O, and an
    import of a module that is not pure."""
    (tmp_path / "p2pnode" / "wire").mkdir(parents=True)
    (tmp_path / "p2pnode" / "discovery").mkdir()
    upward = tmp_path / "p2pnode" / "wire" / "x.py"
    upward.write_text(
        "from ..learning.driver import RoundDriver\nfrom p2pnode.node import Node\nfrom ..metrics import M\n"
    )
    assert len(upward_imports(upward, tmp_path)) == 2
    marked = tmp_path / "p2pnode" / "discovery" / "y.py"
    marked.write_text(f"import time\nfrom ..wire.x import X\n{PURE_MARK}\nopen('f')\n")
    assert pure_modules(tmp_path) == {("discovery", "y")}
    found = impurities(marked, pure_modules(tmp_path), tmp_path)
    assert found == ["imports time", "line 4 calls open", "imports p2pnode.wire.x.X, which is not pure"], found
