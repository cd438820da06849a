"""The deployment files and docs/deploy.md hold to the code: every TOML block loads with the
real config loader, the Dockerfile copies what exists and runs commands the CLI has, the
systemd unit passes `systemd-analyze verify`, and the image builds where Docker runs."""

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from p2pnode.config import ConfigError, load_config
from p2pnode.wire.keystore import write_key
from p2pnode_cli import EXIT_USAGE, build_parser
from protocol import Identity

from .helpers import DATA_DIR, DOC, HOSTS, ROOT, filled_in, host_blocks, toml_blocks, write_config

DOCKERFILE = (ROOT / "Dockerfile").read_text()
UNIT = ROOT / "deploy" / "systemd" / "p2pnode@.service"


def install(document: dict, directory: Path, identity: Identity) -> Path:
    """Write the key and the config under `directory` (the key where the config says)."""
    write_key(document["node"]["key"], identity, overwrite=True)
    path = directory / "node.toml"
    path.write_text(tomli_w.dumps(document))
    return path


def test_every_toml_block_of_the_walkthrough_loads(tmp_path):
    keys = {host: Identity.generate() for host in HOSTS}
    hosts = host_blocks()
    assert sorted(hosts) == list(HOSTS)
    configs = {}
    for host, block in hosts.items():
        document = filled_in(block, keys, tmp_path / host / "data")
        configs[host] = load_config(install(document, tmp_path / host, keys[host]))
    addresses = {host: f"tcp://10.0.0.{i + 1}:7000" for i, host in enumerate(HOSTS)}
    for host, config in configs.items():
        assert config.node.advertise == addresses[host] and config.security.curve
        # Each host bootstraps from the other two, under their keys, and allows all three.
        others = {keys[h].public_key.hex() + "@" + addresses[h] for h in HOSTS if h != host}
        assert set(config.discovery.bootstrap) == others
        assert set(config.security.allowlist) == {identity.public_key for identity in keys.values()}
    # The other blocks are additions to a host's configuration.
    additions = [block for block in toml_blocks() if block not in hosts.values()]
    assert additions
    for index, block in enumerate(additions):
        document = filled_in(hosts["a"], keys, tmp_path / f"add{index}" / "data")
        added = filled_in(block, keys, tmp_path / f"add{index}" / "data")  # it may name a host's key
        for section, table in added.items():  # added to its sections, key by key
            document[section] = {**document.get(section, {}), **table}
        config = load_config(install(document, tmp_path / f"add{index}", keys["a"]))
        for section, table in added.items():
            for key, value in table.items():
                loaded = getattr(getattr(config, section), key)
                assert (list(loaded) if isinstance(loaded, tuple) else loaded) == value, f"[{section}].{key}"


def test_a_key_name_left_in_place_is_refused_naming_the_entry(tmp_path):
    keys = {host: Identity.generate() for host in HOSTS if host != "b"}
    document = filled_in(host_blocks()["a"], keys, tmp_path / "data")
    path = install(document, tmp_path, keys["a"])
    with pytest.raises(ConfigError, match=r"\[discovery\]\.bootstrap: entry 1: expected 64 hex digits"):
        load_config(path)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def test_the_dockerfile_copies_what_exists_and_runs_commands_the_cli_has():
    instructions = dockerfile_instructions()
    kinds = [kind for kind, _ in instructions]
    bases = [args for kind, args in instructions if kind == "FROM"]
    assert all(base.startswith("python:${PYTHON_VERSION}-slim") for base in bases)
    version = re.search(r"ARG PYTHON_VERSION=(3\.\d+)", DOCKERFILE).group(1)
    assert tuple(map(int, version.split("."))) >= (3, 11)  # pyproject: requires-python >= 3.11
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    for kind, args in instructions:
        if kind == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                assert source.rstrip("/") in allowed, f"COPY {source}: excluded by .dockerignore"
    packages = re.search(r"include = \[(.*?)\]", (ROOT / "pyproject.toml").read_text()).group(1)
    for package in re.findall(r'"(\w+)\*"', packages):
        assert f"COPY {package} {package}" in DOCKERFILE, f"the image lacks the package {package}"
    assert re.search(r"^torch==", (ROOT / "constraints.txt").read_text(), flags=re.M)  # the version the image takes
    # A non-root user, the volume of the documented data directory, the documented port.
    user = [args for kind, args in instructions if kind == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert '["/var/lib/p2pnode"]' in dict(instructions)["VOLUME"] and DATA_DIR.startswith("/var/lib/p2pnode/")
    assert dict(instructions)["EXPOSE"] == "7000/tcp 7001/tcp" and 'listen = "tcp://*:7000"' in DOC
    assert 'peer_listen = "tcp://*:7001"' in DOC
    assert dict(instructions)["STOPSIGNAL"] == "SIGTERM"
    # The entry point is the console script; the command and the health check parse.
    assert dict(instructions)["ENTRYPOINT"] == '["p2pnode"]'
    assert 'p2pnode = "p2pnode_cli:main"' in (ROOT / "pyproject.toml").read_text()
    command = tomllib.loads(f"c = {dict(instructions)['CMD']}")["c"]
    assert command == ["start", "--config", "/etc/p2pnode/node.toml"]
    build_parser().parse_args(command)
    health = dict(instructions)["HEALTHCHECK"].split(" CMD ", 1)[1]
    argv = shlex.split(health.split(">")[0])
    assert argv[0] == "p2pnode" and argv[1:] == ["status", "--config", "/etc/p2pnode/node.toml"]
    build_parser().parse_args(argv[1:])
    assert kinds.count("FROM") == 2  # a build stage; the image keeps only the virtual environment


def test_status_of_a_learning_node_loads_no_torch(tmp_path):
    """The health check (and `stop`) only look for the node: no seconds of torch import."""
    learning = {"data": {"dataset": "digits", "nodes": 2}, "algorithm": {"name": "mapl"}}
    path = write_config(tmp_path, "tcp://127.0.0.1:0", **learning)
    probe = (
        "import sys\nfrom p2pnode_cli import main\ncode = main(['status', '--config', sys.argv[1]])\n"
        "sys.exit(99 if 'torch' in sys.modules else code)"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr  # 99: torch was imported
    assert "no node is running with this configuration" in result.stderr


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_the_systemd_unit_runs_the_documented_command_as_a_dedicated_user():
    settings = unit_settings()
    executable, *argv = shlex.split(settings["ExecStart"][0])
    assert executable == "/opt/p2pnode/bin/p2pnode" and "/opt/p2pnode/bin/pip install" in DOC
    assert argv == ["start", "--config", "/etc/p2pnode/%i.toml"]
    build_parser().parse_args(argv)
    assert settings["User"] == ["p2pnode"] and settings["KillSignal"] == ["SIGTERM"]
    assert settings["Restart"] == ["on-failure"] and settings["RestartPreventExitStatus"] == [str(EXIT_USAGE)]
    # A daemon that keeps dying is given up on, as `p2pnode testnet --restart --max-restarts` does.
    assert settings["RestartSec"] == ["5"] and settings["StartLimitBurst"] == ["5"]
    assert settings["StartLimitIntervalSec"] == ["600"]
    # Instance `node`: its state directory is the doc's data directory, and the only writable one.
    assert settings["StateDirectory"] == ["p2pnode/%i"] and settings["ReadWritePaths"] == ["/var/lib/p2pnode/%i"]
    assert DATA_DIR == "/var/lib/p2pnode/node" and settings["ProtectSystem"] == ["strict"]
    for hardening in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices"):
        assert settings[hardening] == ["yes"], hardening


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path):
    # verify checks that ExecStart's program exists: point it at this environment's p2pnode.
    program = Path(sys.executable).parent / "p2pnode"
    if not program.exists():
        pytest.skip(f"no p2pnode console script next to {sys.executable}")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/p2pnode/bin/p2pnode", str(program)))
    (tmp_path / "p2pnode@node.service").symlink_to(unit.name)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(tmp_path / "p2pnode@node.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # An unknown or misspelt setting is only a warning ("Unknown key ..., ignoring"): none allowed.
    assert result.returncode == 0 and str(tmp_path) not in result.stdout + result.stderr, result.stderr


def _docker_unusable() -> str | None:
    if shutil.which("docker") is None:
        return "docker is not installed"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "docker info did not answer within 30 s"
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"no Docker daemon to build with: {reason}"
    return None


@pytest.mark.timeout(1800)
def test_the_image_builds_and_runs_the_cli(tmp_path):
    reason = _docker_unusable()
    if reason:
        pytest.skip(reason)
    tag = "p2pnode-test:latest"
    build = subprocess.run(["docker", "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=1700)
    assert build.returncode == 0, build.stderr[-4000:]
    volume = f"p2pnode-test-{tmp_path.name}"
    try:
        run = ["docker", "run", "--rm", "-v", f"{volume}:/var/lib/p2pnode", tag]
        keygen = subprocess.run([*run, "keygen", "--out", f"{DATA_DIR}/key.pem"], capture_output=True, text=True)
        assert keygen.returncode == 0 and re.fullmatch(r"[0-9a-f]{16}\n", keygen.stdout), keygen.stderr
        info = subprocess.run([*run, "keyinfo", f"{DATA_DIR}/key.pem"], capture_output=True, text=True)
        assert info.returncode == 0 and keygen.stdout.strip() in info.stdout
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
