"""Helpers to run real daemons in tests: configs on disk, nodes in-process under trio, polling."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import tomli_w
import trio

from p2pnode.config import load_config
from p2pnode.node import Node
from p2pnode.wire.keystore import write_key
from protocol import Identity

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
