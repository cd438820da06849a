"""The dependency rules of docs/architecture.md, checked on the source: who may import what."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "algorithms", "p2pnode", "testnet", "tools")
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


def test_daemon_never_imports_testnet_and_nothing_imports_the_cli():
    for package in PACKAGES:
        for path in files(package):
            names = imports(path)
            relative = path.relative_to(ROOT)
            is_cli = relative.parts[:2] in {("p2pnode", "cli.py"), ("p2pnode", "cli")}
            if package == "p2pnode" and not is_cli:
                assert not any(top(n) == "testnet" for n in names), f"{relative} imports testnet"
            if not is_cli and relative != Path("p2pnode/__main__.py"):
                assert not any(n.startswith("p2pnode.cli") for n in names), f"{relative} imports the CLI"


def test_only_the_cli_imports_tools_and_tools_imports_anything_but_the_cli():
    """Benchmarks and demos (tools/) may use every package; the daemon, the launcher, the
    algorithms and the protocol never depend on them, only the CLI runs them."""
    for package in PACKAGES:
        for path in files(package):
            relative = path.relative_to(ROOT)
            names = imports(path)
            if package == "tools":
                assert not any(n.startswith("p2pnode.cli") for n in names), f"{relative} imports the CLI"
            elif relative.parts[:2] not in {("p2pnode", "cli.py"), ("p2pnode", "cli")}:
                assert not any(top(n) == "tools" for n in names), f"{relative} imports tools"


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
