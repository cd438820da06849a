"""`p2pnode init`: a key and a ready-to-run config for each node of a small fleet, like
`flwr new` for a federation.

Node i gets DIR/node<i>/ with `key.pem` (Ed25519, mode 0600, as `p2pnode keygen` writes it) and
`node.toml`: its own data directory (`data`, beside the config), its own ports, CURVE on and every
other node of the fleet as a bootstrap entry `KEY@tcp://HOST:PORT`, so the nodes can start in any
order and find each other whichever are up. Hosts are dealt round-robin from the list given; the
nodes that share a host take consecutive port pairs (public, peers') from the base port, so a
fleet on three hosts uses 7000 and 7001 on each, and one on loopback 7000 to 7005.

The `[data]` section is what the user fills in: either each node's own folder or `.npz` (one
entry per node in `data_per_node`, written relative to the config file, so a fleet directory
moved with its data, or copied to a device with the same layout, still finds it), or, as a
placeholder that runs as written, the node's shard of the bundled mnist5k with a comment saying
how to put one's own images there instead.

Every config written is loaded with `load_config` before `write_fleet` returns; if one does not
load, everything it wrote is removed again and what `--force` replaced is put back: a failed
`init` leaves DIR as it found it.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from algorithms.catalog import DEFAULT_ALGORITHM
from protocol import Identity

from .config import ConfigError, load_config
from .wire.keystore import write_key

__all__ = ["FleetSpec", "FleetError", "write_fleet", "check_fleet", "fleet_configs", "node_directory", "MAX_FLEET"]

MAX_FLEET = 257  # every node names all the others, and a bootstrap list holds at most 256 entries
KEY_FILE, CONFIG_FILE = "key.pem", "node.toml"
# Inbound connections one node holds from each other node on its host: the public and the peers'
# socket, and for a while a restarted peer's old ones (testnet/launch/cluster.py sizes its caps alike).
CONNECTIONS_PER_NEIGHBOUR = 4
DEFAULT_PER_ADDRESS = 32  # [security].max_connections_per_address's default


class FleetError(Exception):
    """The fleet cannot be written as asked; the message says why and what to do."""


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    out: Path
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 7000  # the first node on a host listens here, its peers' socket one above
    network: str = "p2pnode"
    algorithm: str = DEFAULT_ALGORITHM
    rounds: int = 60
    backbone: str = "convnet"  # a built-in name, or the user's own as "module:callable"
    code: Path | None = None  # [model].code: the folder the user's backbone is imported from
    weights: Path | None = None  # [model].weights: a state dict every node's backbone starts from
    settings: dict[str, object] = field(default_factory=dict)  # [algorithm.settings], TOML values
    local_baseline: bool = False  # [algorithm].local_baseline: a Local model beside the algorithm's
    data_per_node: Path | None = None  # one folder or .npz per node, in name order
    class_names: tuple[str, ...] = ()  # default: the class folders found under data_per_node
    image_size: int | None = None
    force: bool = False
    behind_nat: frozenset[int] = frozenset()  # nodes nobody can dial: client mode, dialling the others


@dataclass(frozen=True)
class _Slot:
    """Where one node runs: its host and its two ports."""

    host: str
    port: int

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def node_directory(spec: FleetSpec, index: int) -> Path:
    """DIR/node<i>, numbered with as many digits as the largest index, so they sort in order."""
    return spec.out / f"node{index:0{len(str(spec.nodes - 1))}d}"


def fleet_configs(directory: Path) -> list[Path]:
    """The configs of a fleet directory as `init` writes it: every DIR/*/node.toml, in name order."""
    return sorted(Path(directory).glob(f"*/{CONFIG_FILE}"))


def write_fleet(spec: FleetSpec) -> list[Path]:
    """Write every node's key and config, each checked as `start` would load it; returns the
    configs' paths, in node order. Raises FleetError, having written nothing (or put back what it
    wrote over), if the request cannot be met or a config written does not load."""
    slots = _slots(spec)
    data = _data_entries(spec)
    class_names = _class_names(spec, data)
    created = not spec.out.exists()
    replaced = _prepare(spec)
    try:
        paths = _write_nodes(spec, slots, data, class_names)
        problems = check_fleet(paths)
        if problems:
            raise FleetError("the configs written do not load:\n  " + "\n  ".join(problems))
    except BaseException:
        for index in range(spec.nodes):
            shutil.rmtree(node_directory(spec, index), ignore_errors=True)
        if replaced is not None:
            for moved in sorted(replaced.iterdir()):
                moved.rename(spec.out / moved.name)
        if created:
            shutil.rmtree(spec.out, ignore_errors=True)
        raise
    finally:
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    return paths


def _write_nodes(spec: FleetSpec, slots: list[_Slot], data: list[Path] | None, class_names: tuple[str, ...]):
    identities = [Identity.generate() for _ in range(spec.nodes)]
    peers_per_host = {host: sum(slot.host == host for slot in slots) for host in spec.hosts}
    paths = []
    for index, (identity, slot) in enumerate(zip(identities, slots, strict=True)):
        directory = node_directory(spec, index)
        directory.mkdir(parents=True)
        write_key(directory / KEY_FILE, identity)
        others = [  # a node behind a NAT is dialled by nobody: it dials the others
            f"{other.public_key.hex()}@{s.address}"
            for number, (other, s) in enumerate(zip(identities, slots, strict=True))
            if number != index and number not in spec.behind_nat
        ]
        text = _config_text(spec, index, slot, others, peers_per_host[slot.host], data, class_names)
        (directory / CONFIG_FILE).write_text(text)
        paths.append(directory / CONFIG_FILE)
    return paths


def check_fleet(paths: list[Path]) -> list[str]:
    """Every problem `load_config` finds in the written configs, each prefixed with its file."""
    problems = []
    for path in paths:
        try:
            load_config(path)
        except ConfigError as exc:
            problems += [f"{path}: {problem}" for problem in exc.problems]
    return problems


def _slots(spec: FleetSpec) -> list[_Slot]:
    if not 1 <= spec.nodes <= MAX_FLEET:
        raise FleetError(f"--nodes: 1 to {MAX_FLEET} (each node names all the others as bootstrap entries)")
    if any(not 0 <= index < spec.nodes for index in spec.behind_nat):
        raise FleetError(f"--behind-nat: node numbers 0 to {spec.nodes - 1}, got {sorted(spec.behind_nat)}")
    if spec.behind_nat and len(spec.behind_nat) == spec.nodes:
        raise FleetError("--behind-nat: at least one node must be reachable (nodes behind NATs dial it; no relay yet)")
    if not spec.hosts or any(not host or any(c in host for c in " /@:[]") for host in spec.hosts):
        raise FleetError(f"--hosts: expected host names or IPv4 addresses separated by commas, got {spec.hosts!r}")
    slots, used = [], dict.fromkeys(spec.hosts, 0)
    for index in range(spec.nodes):
        host = spec.hosts[index % len(spec.hosts)]
        port = spec.port + 2 * used[host]
        used[host] += 1
        if port + 1 > 65535:
            raise FleetError(
                f"--port {spec.port}: {used[host]} nodes on {host} need ports up to {port + 1} (max 65535)"
            )
        slots.append(_Slot(host, port))
    return slots


def _prepare(spec: FleetSpec) -> Path | None:
    """An existing, non-empty DIR is refused; with `force` the node directories it would write
    (data directories included; other files in DIR stay) are moved into a hidden directory of DIR,
    which is returned: removed once the fleet is written, moved back if it is not."""
    if spec.out.exists() and not spec.out.is_dir():
        raise FleetError(f"--out {spec.out}: exists and is not a directory")
    spec.out.mkdir(parents=True, exist_ok=True)
    if not any(spec.out.iterdir()):
        return None
    if not spec.force:
        raise FleetError(
            f"--out {spec.out}: exists and is not empty; choose another directory, or --force to replace "
            "its node directories (their keys and data directories go with them)"
        )
    replaced = Path(tempfile.mkdtemp(prefix=".replaced-", dir=spec.out))
    for index in range(spec.nodes):
        directory = node_directory(spec, index)
        if directory.exists():
            directory.rename(replaced / directory.name)
    return replaced


def _data_entries(spec: FleetSpec) -> list[Path] | None:
    """Each node's folder or .npz under `data_per_node`, in name order (hidden names skipped)."""
    if spec.data_per_node is None:
        return None
    root = spec.data_per_node.expanduser().resolve()
    if not root.is_dir():
        raise FleetError(f"--data-per-node {spec.data_per_node}: not a directory")
    entries = sorted(
        entry
        for entry in root.iterdir()
        if not entry.name.startswith(".") and (entry.is_dir() or entry.suffix.lower() == ".npz")
    )
    if len(entries) != spec.nodes:
        raise FleetError(
            f"--data-per-node {spec.data_per_node}: {len(entries)} folders or .npz files for --nodes {spec.nodes}; "
            "it needs one per node (taken in name order)"
        )
    return entries


def _class_names(spec: FleetSpec, data: list[Path] | None) -> tuple[str, ...]:
    """The network's class list: as given, or every class folder's name found in the nodes'
    folders, sorted (the same list goes to every node: ids are positions in it)."""
    if spec.class_names or data is None:
        return spec.class_names
    npz = [entry.name for entry in data if not entry.is_dir()]
    if npz:
        raise FleetError(f"--data-per-node: {', '.join(npz)}: a .npz holds class ids, not names: give --class-names")
    names = sorted(
        {child.name for entry in data for child in entry.iterdir() if child.is_dir() and not child.name.startswith(".")}
    )
    if len(names) < 2:
        raise FleetError(
            f"--data-per-node {spec.data_per_node}: found {len(names)} class folders in the nodes' folders "
            "(expected NODE/CLASS/IMAGE, at least 2 classes in all)"
        )
    return tuple(names)


def _config_text(
    spec: FleetSpec,
    index: int,
    slot: _Slot,
    bootstrap: list[str],
    on_host: int,
    data: list[Path] | None,
    class_names: tuple[str, ...],
) -> str:
    client = index in spec.behind_nat
    node = {"key": KEY_FILE, "data_dir": "data", "network": spec.network}
    node.update({"client_mode": True} if client else _addresses(slot))
    security: dict = {"curve": True}
    per_address = CONNECTIONS_PER_NEIGHBOUR * (on_host - 1)
    if per_address > DEFAULT_PER_ADDRESS:  # the fleet's nodes on one host connect from one address
        security["max_connections_per_address"] = per_address
    # Clients reach each other through the reachable nodes, which relay for them where there are
    # two or more; where there is one, its peers are the reachable nodes.
    relays = len(spec.behind_nat) >= 2
    peers = spec.nodes - len(spec.behind_nat) if client and not relays else spec.nodes - 1
    algorithm = {"name": spec.algorithm, "rounds": spec.rounds, "start_peers": min(peers, 64)}
    if spec.local_baseline:
        algorithm["local_baseline"] = True
    if spec.settings:
        algorithm["settings"] = dict(spec.settings)
    parts = [
        f"# node {index} of a fleet of {spec.nodes}, written by `p2pnode init` (docs/deploy.md, docs/config.md)\n"
        + tomli_w.dumps({"node": node}),
        "# Every other node of the fleet, with its public key: CURVE derives the connection's key from it.\n"
        + tomli_w.dumps({"discovery": {"bootstrap": bootstrap}}),
        tomli_w.dumps({"security": security}),
        *([RELAY_TEXT] if relays and not client else []),
        _data_text(spec, index, data, class_names),
        tomli_w.dumps({"model": _model_settings(spec, index, on_host)}),
        "# start_peers: round 0 waits for the other nodes (or [algorithm].start_timeout_s).\n"
        + tomli_w.dumps({"algorithm": algorithm}),
    ]
    return "\n".join(part.rstrip("\n") + "\n" for part in parts)


RELAY_TEXT = (
    "# The nodes behind NATs (--behind-nat) reach each other through this one: it holds places for them\n"
    '# and forwards their frames, sealed end to end (docs/deploy.md, "Behind a NAT or a firewall").\n'
    + tomli_w.dumps({"relay": {"enabled": True}})
)


def _model_settings(spec: FleetSpec, index: int, on_host: int) -> dict:
    """[model]: the backbone; the user's code and weights relative to the config, like its data."""
    model: dict = {"backbone": spec.backbone, "threads": 1 if on_host > 1 else 0}
    for key in ("code", "weights"):
        path = getattr(spec, key)
        if path is not None:
            model[key] = os.path.relpath(path.resolve(), node_directory(spec, index).resolve())
    return model


def _addresses(slot: _Slot) -> dict[str, str]:
    """An IP address is bound as it is; a host name is advertised, and every interface bound."""
    try:
        ipaddress.ip_address(slot.host)
    except ValueError:
        return {
            "listen": f"tcp://*:{slot.port}",
            "advertise": slot.address,
            "peer_listen": f"tcp://*:{slot.port + 1}",
        }
    return {"listen": slot.address, "peer_listen": f"tcp://{slot.host}:{slot.port + 1}"}


def _data_text(spec: FleetSpec, index: int, data: list[Path] | None, class_names: tuple[str, ...]) -> str:
    if data is None:
        return (
            "# YOUR DATA GOES HERE. As written, each node trains on its shard of mnist5k (bundled), so the\n"
            "# fleet runs as is. For this device's own images, replace the three lines below with\n"
            '#   path = "/path/to/images"          # one sub-folder of images per class\n'
            '#   class_names = ["cat", "dog"]      # the same list, in the same order, on every node\n'
            '# (docs/config.md, "Your own data").\n'
            + tomli_w.dumps({"data": {"dataset": "mnist5k", "nodes": spec.nodes, "node_index": index}})
        )
    # Relative to the config file (load_config reads it so): no path of the machine init ran on.
    own: dict = {
        "path": os.path.relpath(data[index], node_directory(spec, index).resolve()),
        "class_names": list(class_names),
        "node_index": index,  # seeds its model as node i of `simulate --data-per-node` (its rehearsal)
    }
    if spec.image_size is not None and data[index].is_dir():
        own["image_size"] = spec.image_size
    return "# This node's own data; class_names is the same list, in the same order, on every node.\n" + tomli_w.dumps(
        {"data": own}
    )
