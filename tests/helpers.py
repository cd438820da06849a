"""The tests' one helpers module: real daemons (configs on disk, nodes in-process under trio), polling,
and what several test modules share (fleets, own data, records, message examples). No test module
imports another (tests/test_structure.py checks)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import time
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest
import tomli_w
import trio
from PIL import Image

from algorithms.data.datasets import load_dataset
from algorithms.data.own_data import held_out_split, inspect_own_data
from p2pnode.config import load_config
from p2pnode.learning.rounds import RoundRecord
from p2pnode.node import Node
from p2pnode.wire.keystore import write_key
from p2pnode_cli import main
from protocol import DEFAULT_LIMITS, Identity
from protocol.tensors import encode_tensor
from testnet.launch.cluster import Cluster
from testnet.launch.placement import DAEMON, NodeSpec, read_status
from testnet.launch.warm_parent import WarmParent

FAST_DISCOVERY = {"ping_interval_s": 0.2, "peer_timeout_s": 1.0, "exchange_interval_s": 0.5, "dial_retry_max_s": 0.5}


# The daemons of these tests speak plaintext unless a test asks for CURVE (`security=...`): the
# attackers of tests/adversarial/ speak raw ZMTP without it, and tests/adversarial/test_curve.py
# and the testnets (which turn it on, as the default does) cover CURVE.
PLAINTEXT = {"curve": False}


def write_config(directory: Path, listen: str, bootstrap=(), identity: Identity | None = None, **sections) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    sections["security"] = {**PLAINTEXT, **sections.get("security", {})}
    key = directory / "key.pem"
    if not key.exists():
        write_key(key, identity or Identity.generate())
    discovery = {"bootstrap": list(bootstrap), **FAST_DISCOVERY, **sections.pop("discovery", {})}
    document = {
        "node": {"key": "key.pem", "listen": listen, "network": "test", **sections.pop("node", {})},
        "discovery": discovery,
        **sections,
    }
    path = directory / "node.toml"
    path.write_text(tomli_w.dumps(document))
    return path


ANY_PORT = "tcp://127.0.0.1:0"  # the OS picks a free port when the node binds; node.address tells which


async def start_node(
    nursery: trio.Nursery, directory: Path, bootstrap=(), identity: Identity | None = None, **sections
) -> Node:
    """One node on a port the OS picks, running once this returns: its `address` is where it listens."""
    config = load_config(write_config(directory, ANY_PORT, bootstrap, identity, **sections))
    return await nursery.start(Node(config).run)


def bootstrap_entry(node: Node) -> str:
    """How another node names `node` in its bootstrap list: with its key when CURVE is on."""
    if node.config.security.curve:
        return f"{node.identity.public_key.hex()}@{node.address}"
    return node.address


async def start_chain(nursery: trio.Nursery, root: Path, count: int, **sections) -> list[Node]:
    """`count` nodes under root/n0, root/n1, ..., started one after the other, each with the
    node started before it as its only bootstrap peer; peer exchange does the rest."""
    nodes: list[Node] = []
    for i in range(count):
        bootstrap = [bootstrap_entry(nodes[-1])] if nodes else []
        nodes.append(await start_node(nursery, root / f"n{i}", bootstrap, **sections))
    return nodes


async def wait_until(condition, timeout: float, interval: float = 0.05) -> float:
    started = trio.current_time()
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(interval)
    return trio.current_time() - started


def full_mesh(nodes: list[Node]) -> bool:
    keys = {node.identity.public_key for node in nodes}
    return all(set(node.membership.peers) == keys - {node.identity.public_key} for node in nodes)


def free_udp_port() -> int:
    """A UDP port for a LAN beacon test. Unlike a TCP listen address this cannot be read back
    after the fact: the beacon port is a rendezvous that every node must know before it starts
    (each binds it with SO_REUSEADDR and sends to group:port, and `[beacon].port` cannot be 0).
    So the port is picked here, once, for all of a test's nodes; it need not stay free (a bind
    with SO_REUSEADDR does not fail), it only keeps concurrent tests from hearing each other."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_lines(root: Path, *words: str) -> str:
    """The lines of every node log under `root` (a testnet's directory) that hold one of `words`,
    prefixed with the node: what an assertion on a testnet's report shows when it fails."""
    lines = []
    for log in sorted(root.glob("*/node.log")):
        lines += [
            f"{log.parent.name}: {line}" for line in log.read_text().splitlines() if any(w in line for w in words)
        ]
    return "\n".join(lines)


def signal_each_start(
    directory: Path, signum: int = signal.SIGKILL, times: int = 1, timeout: float = 30.0
) -> list[int]:
    """Send `signum` to the daemon of testnet node `directory` once it is up (it holds its lock,
    which names its pid, and has its control socket), then to each daemon started there after it,
    `times` in all: crashes the launcher did not cause. Returns the pids signalled, fewer if
    `timeout` ran out first. Runs in a thread beside the launcher."""
    lock, control = directory / "data" / "node.lock", directory / "data" / "control.sock"
    signalled: list[int] = []
    deadline = time.monotonic() + timeout
    while len(signalled) < times and time.monotonic() < deadline:
        try:
            pid = lock.read_text().strip()  # a dead daemon's pid stays there until the next one takes the lock
        except FileNotFoundError:
            pid = ""
        if control.exists() and pid.isdigit() and int(pid) not in signalled:
            try:
                os.kill(int(pid), signum)
                signalled.append(int(pid))
            except ProcessLookupError:
                pass  # gone already: wait for the next one
        time.sleep(0.02)
    return signalled


# --- shared by several test modules (no test module imports another) ---------------------


def learning_sections(index: int, nodes: int, rounds: int = 4, **algorithm) -> dict:
    return {
        "data": {
            "dataset": "digits",
            "nodes": nodes,
            "node_index": index,
            "samples_per_class": 10,
            "test_per_class": 5,
        },
        "model": {"backbone": "mlp", "threads": 1},
        "algorithm": {
            "name": "mapl",
            "rounds": rounds,
            "start_peers": nodes - 1,
            "round_deadline_s": 1.0,
            "settings": {"warmup_rounds": 2},
            **algorithm,
        },
    }


async def scrape(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return answer


def same_keys(a: dict, b: dict, path: str = "") -> list[str]:
    """Where two reports' keys differ, at every level (the traffic by type, the refusals by
    reason and the algorithm's configuration are data, not schema; so is the provenance's
    description of what ran the nodes, which a simulation's engine and a testnet's launcher tell
    differently; a daemon may refuse what no simulated node meets: a payload from a peer it has
    not admitted yet)."""
    data = ("by_type", "config", "engine", "rejections")
    differences = [f"{path}{key}" for key in sorted(set(a) ^ set(b), key=str)]
    for key in set(a) & set(b):
        if isinstance(a[key], dict) and isinstance(b[key], dict) and key not in data:
            differences += same_keys(a[key], b[key], f"{path}{key}.")
    return differences


def same_records(spec, histories) -> None:
    """One round engine (p2pnode/learning/engine.py) builds every record: the daemons' and the simulator's
    have the same fields, all filled in, and agree on what the round was (node i of the testnet
    against node i of the simulation, round by round)."""
    from testnet.simulation.exchange import simulation_identity
    from testnet.simulation.hosting import INLINE, open_hosts
    from testnet.simulation.simulator import timeline

    ids = [simulation_identity(spec.seed, i).node_id for i in range(spec.nodes)]
    with open_hosts(spec, INLINE) as hosts:
        ended = [record for together in timeline(spec, hosts, ids).run() for record in together]
    by_round = {(record.round, ids.index(record.node)): record for record in ended}
    simulated = [[by_round[(round, i)] for i in range(spec.nodes)] for round in range(spec.rounds)]
    daemons = [[history.records[round] for history in histories] for round in range(spec.rounds)]
    agreeing = ("round", "expected", "arrived", "recipients")
    for ours, theirs in zip(simulated, daemons, strict=True):
        for simulated_record, daemon_record in zip(ours, theirs, strict=True):
            simulated_dict, daemon_dict = simulated_record.to_dict(), daemon_record.to_dict()
            assert simulated_dict.keys() == daemon_dict.keys()
            # A gather that waited out its deadline for a peer still in its own previous round
            # (it waited out the same deadline, for a peer that stopped sending to it) races that
            # peer's next payload by a step's length: real and simulated time may fall either way.
            raced = simulated_record.gather_s >= spec.round_deadline_s
            compared = [key for key in agreeing if not (raced and key == "arrived")]
            assert [simulated_dict[key] for key in compared] == [daemon_dict[key] for key in compared]
            assert None not in (simulated_record.gather_s, simulated_record.round_s, daemon_record.gather_s)
            # when the round ended: simulated seconds, and the daemon's own since its first round
            assert simulated_record.ended_at > 0 and daemon_record.ended_at > 0
            assert simulated_record.discovery_sent == {} and daemon_record.discovery_sent
    for history in histories:  # a daemon's rounds end one after the other
        ended = [record.ended_at for record in history.records]
        assert ended == sorted(ended), ended
    final = [[record.accuracy for record in last] for last in (simulated[-1], daemons[-1])]
    assert abs(statistics.mean(final[0]) - statistics.mean(final[1])) <= 0.02


DIGITS = tuple(str(k) for k in range(10))


def write_digit_pngs(root, classes, *, part: int = 0, parts: int = 1, per_class: int | None = None) -> int:
    """scikit-learn's real 8×8 digits as grayscale PNGs under root/<class>/ (0..16 scaled to
    0..255): of each class, the `part`-th of `parts` disjoint slices, at most `per_class` images.
    Returns how many were written."""
    digits = load_dataset("digits")
    written = 0
    for k in classes:
        members = np.flatnonzero(digits.train.labels == k)
        members = np.array_split(members, parts)[part][:per_class]
        folder = root / str(k)
        folder.mkdir(parents=True, exist_ok=True)
        for index in members:
            pixels = np.round(digits.train.images[index, 0] * 255).astype(np.uint8)
            Image.fromarray(pixels, "L").save(folder / f"{index:04d}.png")
            written += 1
    return written


def own_data_sections(folder, class_names=DIGITS, rounds: int = 2, start_peers: int = 2) -> dict:
    return {
        "data": {"path": str(folder), "class_names": list(class_names), "image_size": 8},
        "model": {"backbone": "mlp", "threads": 1},
        "algorithm": {
            "name": "mapl",
            "rounds": rounds,
            "start_peers": start_peers,
            "start_timeout_s": 30.0,
            "round_deadline_s": 5.0,
            # every round but the last in warm-up (all exchange with all); it must end before the run
            "settings": {"warmup_rounds": max(1, rounds - 1)},
            "checkpoint": False,
        },
    }


def held_out_files(config) -> tuple[list[str], list[int]]:
    """The node's held-out images, in the order of its test split, and their classes."""
    spec = config.data.own_data()
    files = inspect_own_data(spec).files
    labels = np.array([k for _, k in files])
    _, test = held_out_split(labels, 0.2, spec.seed)
    return [str(files[i][0]) for i in test], labels[test].tolist()


def init(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = main(["init", *argv])
    printed = capsys.readouterr()
    return code, printed.out.split(), printed.err


def free_ports(count: int) -> int:
    """A base port with `count` free ports above it (the fleet's are fixed in its configs)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free port range")


def run_fleet(directories, timeout_s: float = 90) -> list[dict]:
    """`p2pnode start` of each node directory's node.toml, until every node's learning is done;
    returns their statuses, after stopping them (each must exit 0). The daemons are forked from a
    warm parent (testnet/launch/warm_parent.py: `python -m p2pnode_cli start --config …`, its imports
    done once), as a local testnet's are."""
    specs = [NodeSpec(index, directory, {}) for index, directory in enumerate(directories)]
    server = WarmParent.shared()
    try:
        for spec in specs:
            spec.process = server.spawn(DAEMON, ["--config", str(spec.config_path)], spec.log_path)
        deadline = time.monotonic() + timeout_s
        while not all(
            (s := read_status(spec.control_socket, 1.0)) and s["learning"]["phase"] == "done" for spec in specs
        ):
            assert all(spec.process.poll() is None for spec in specs), [spec.log_path.read_text() for spec in specs]
            assert time.monotonic() < deadline, [spec.log_path.read_text()[-3000:] for spec in specs]
            time.sleep(0.3)
        return [read_status(spec.control_socket, 2.0) for spec in specs]
    finally:
        stop_daemons(specs)


def stop_daemons(specs) -> None:
    """SIGTERM each daemon still running; each must exit 0 (else it is killed, and that raised)."""
    for spec in specs:
        if spec.process is not None and spec.process.poll() is None:
            spec.process.send_signal(signal.SIGTERM)
    for spec in specs:
        if spec.process is not None:
            try:
                assert spec.process.wait(timeout=30) == 0
            except Exception:
                spec.process.kill_group()
                raise


def record(node: str = "a", round: int = 0, **fields) -> RoundRecord:
    values = {
        "accuracy": 0.5,
        "own_class_accuracy": 0.6,
        "loss": 1.0,
        "test_loss": 1.2,
        "weights": {node: 1.0},
        "expected": 0,
        "arrived": 0,
        "missing": (),
        "recipients": 0,
        "sent": {},
        "step_s": 0.1,
    }
    return RoundRecord(node=node, round=round, **{**values, **fields})


def wire_tensor(array):
    obj = encode_tensor(np.asarray(array), DEFAULT_LIMITS)
    return {**obj, "data": bytes(obj["data"])}


VALID = {
    "HELLO": {
        "address": "tcp://127.0.0.1:7000",
        "capabilities": ["mapl"],
        "dataset_size": 100,
        "protocol_versions": [1],
        "peer_port": 7001,
    },
    "PEERS": {"hellos": []},
    "PING": {"nonce": 1},
    "PONG": {"nonce": 1},
    "BYE": {"reason": "shutdown"},
    "DIAL_ME": {"nonce": 1, "port": 7000},
    "DIALED": {"nonce": 1, "address": "tcp://198.51.100.7:7000"},
    "PROTOTYPES": {
        "classes": [0, 1],
        "counts": [3, 4],
        "prototypes": wire_tensor(np.ones((2, 4), np.float32)),
        "head": None,
    },
    "HEAD": {"weight": wire_tensor(np.ones((3, 4), np.float32)), "bias": wire_tensor(np.zeros(3, np.float32))},
    "SCORE": {"kind": "log_likelihood", "subject": b"\x01" * 32, "subject_seq": 5, "value": -0.5, "samples": 10},
    "MODEL": {
        "kind": "params",
        "tensors": {
            "fc.weight": wire_tensor(np.ones((2, 2), np.float32)),
            "bn.num_batches_tracked": wire_tensor(np.array(7, np.int64)),
        },
        "update": None,
    },
    "PASS": {},
    "ASK": {"query": 7, "images": [b"\x89PNG..."]},
    "ANSWER": {
        "query": 7,
        "classes": [0, 1],
        "threshold": 0.6,
        "labels": [1],
        "probabilities": [0.9],
        "own_probabilities": [0.95],
        "refused": None,
    },
    "RESERVE": {"ttl_s": 600},
    "RESERVED": {"ttl_s": 600, "refused": None},
    "RELAY": {"target": b"\x02" * 32, "sealed": b"\x00" * 64},
    "RELAYED": {"origin": b"\x02" * 32, "sealed": b"\x00" * 64},
    "UNRELAYED": {"target": b"\x02" * 32, "reason": "no_reservation"},
    "REVERSE": {"target": b"\x02" * 32, "hello": b"\x00" * 300},
    "REACH": {"relay_keys": [b"\x02" * 32], "relay_addresses": ["tcp://198.51.100.7:7000"], "expires_us": 10**16},
}


class SmallDisk:
    """A tmpfs of `size` bytes at `path`, to fill, free and remount read-only."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.filler = path / "filler"
        path.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command: cannot make a small file system to fill")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs to fill (needs root): {done.stderr.strip()}")

    def fill(self) -> None:
        """Take every free byte (the node's own writes may free some meanwhile: call again)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 16, 4096, 1):
                try:
                    while True:
                        os.write(fd, bytes(chunk))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=True)


def run_ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def namespaces_work() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    probe = f"p2pprobe{uuid.uuid4().hex[:6]}"
    try:
        run_ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    run_ip("netns", "del", probe)
    return True


def wait_for(condition, timeout: float = 20.0, interval: float = 0.1, why=None):
    """Poll `condition` (blocking) until it returns something true, which is returned; fail after
    `timeout` s, saying `why()` where given. The trio tests' twin is `wait_until`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout} s" + ("" if why is None else f": {why()}"))


def peer_ids(cluster: Cluster, spec) -> set[str] | None:
    status = cluster.status(spec)
    return None if status is None else {p["node_id"] for p in status["peers"]}


# (Ed25519 public key, X25519 secret, X25519 public) of fixed_identity(1) and (2): docs/protocol.md.
VECTORS = [
    (
        "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664",
        "70788f1a0cea001a2631dae5d05dbd062008d5b30f50b9e29beb2a7822289044",
        "4a3807d064d077181cc070989e76891d20dca5559548dc2c77c1a50273882b38",
    ),
    (
        "43cdc023d22d5f9e107d1a0693457d35d1d10eb7d21c721192f56f5de40665d3",
        "281a9fc3d397d561cdc2658c6f5d729c89dff9ed749aaa62b53fd56d5e1ff87f",
        "d802a0b0d9f642e78bc8faf210bf738d7ae91a313b03ffc2c11c84b9d801d078",
    ),
]


ROOT = Path(__file__).resolve().parent.parent


DOC = (ROOT / "docs" / "deploy.md").read_text()


HOSTS = ("a", "b", "c")


DATA_DIR = "/var/lib/p2pnode/node"  # the layout of docs/deploy.md, the image and the unit (instance `node`)


def toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", DOC, flags=re.S)


def host_blocks() -> dict[str, str]:
    """Step 3's configuration of each host, as written in the doc."""
    found = {}
    for block in toml_blocks():
        match = re.match(r"# /etc/p2pnode/node\.toml on host-([a-z])\n", block)
        if match:
            found[match.group(1)] = block
    return found


def filled_in(block: str, keys: dict[str, Identity], data_dir: Path) -> dict:
    """A block as an operator would install it: the key names replaced by public keys, and the
    data directory at `data_dir` (the test's own; the doc's is /var/lib/p2pnode/node)."""
    for host, identity in keys.items():
        block = block.replace(f"{host.upper()}_PUBLIC_KEY", identity.public_key.hex())
    return tomllib.loads(block.replace(DATA_DIR, str(data_dir)))


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
