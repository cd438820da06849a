"""The dependency rules of docs/architecture.md, checked on the source: who may import what."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Who may import whom (docs/architecture.md): a package imports only those below it. tools/ (the
# benchmarks and demos) sits under the command line only; nothing imports the command line.
LAYERS = {
    "protocol": set(),
    "algorithms": {"protocol"},
    "p2pnode": {"protocol", "algorithms"},
    "testnet": {"protocol", "algorithms", "p2pnode"},
    "tools": {"protocol", "algorithms", "p2pnode", "testnet"},
    "p2pnode_cli": {"protocol", "algorithms", "p2pnode", "testnet", "tools"},
}
PACKAGES = tuple(LAYERS)
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


RAY_MODULES = {Path("testnet/rayhosts.py"), Path("testnet/raynodes.py")}  # the engines' Ray sides
RAY_PROBE = Path("testnet/optional.py")  # asks whether Ray is installed, importing it in a function


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
