"""Helpers to run real daemons in tests: configs on disk, nodes in-process under trio, polling."""

from __future__ import annotations

import socket
from pathlib import Path

import tomli_w
import trio

from p2pnode.config import Config, load_config
from p2pnode.keystore import write_key
from p2pnode.node import Node
from protocol import Identity
from testnet.cluster import free_ports

FAST_DISCOVERY = {"ping_interval_s": 0.2, "peer_timeout_s": 1.0, "exchange_interval_s": 0.5, "dial_retry_max_s": 0.5}


def write_config(directory: Path, listen: str, bootstrap=(), identity: Identity | None = None, **sections) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
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


def ring_configs(root: Path, count: int, **sections) -> list[Config]:
    addresses = [f"tcp://127.0.0.1:{port}" for port in free_ports(count)]
    return [
        load_config(write_config(root / f"n{i}", addresses[i], [addresses[(i + 1) % count]], **sections))
        for i in range(count)
    ]


async def start_nodes(nursery: trio.Nursery, configs: list[Config]) -> list[Node]:
    return [await nursery.start(Node(config).run) for config in configs]


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
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
