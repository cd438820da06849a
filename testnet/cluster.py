"""Many real daemons on one machine: keys and configs on disk, one process each, and a
guarantee that every process is gone when the cluster is (`with Cluster(...)`).

Children get PR_SET_PDEATHSIG, so even a launcher killed with SIGKILL leaves no daemon behind,
and they run in their own session, so a terminal's Ctrl-C reaches the launcher alone, which
then stops them in order (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from p2pnode.control import ControlError, request
from p2pnode.keystore import write_key
from protocol import Identity

__all__ = ["NodeSpec", "Cluster", "free_ports"]

_PR_SET_PDEATHSIG = 1


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel hands out as free right now (all held at once, so all distinct)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own cleanup still applies


@dataclass
class NodeSpec:
    index: int
    directory: Path
    address: str
    settings: dict  # the TOML document, as a dict
    node_id: str = ""
    prefix: tuple[str, ...] = ()  # run the daemon under this, e.g. ("ip", "netns", "exec", "host1")
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def config_path(self) -> Path:
        return self.directory / "node.toml"

    @property
    def control_socket(self) -> Path:
        return self.directory / "data" / "control.sock"

    @property
    def log_path(self) -> Path:
        return self.directory / "node.log"


class Cluster:
    def __init__(self, specs: list[NodeSpec], stop_grace_s: float = 10.0) -> None:
        self.specs = specs
        self.stop_grace_s = stop_grace_s

    @classmethod
    def prepare(
        cls,
        out: Path,
        count: int,
        *,
        network: str = "testnet",
        host: str = "127.0.0.1",
        discovery: dict | None = None,
        extra: dict | Callable[[int], dict] | None = None,
    ) -> Cluster:
        """Write a key and a config per node under `out`. Node i knows only node i+1 (a ring).
        `extra` adds sections: one table for all nodes, or a function of the node index."""
        ports = free_ports(count, host)
        addresses = [f"tcp://{host}:{port}" for port in ports]
        specs = []
        for index, address in enumerate(addresses):
            directory = out / f"node{index:02d}"
            directory.mkdir(parents=True, exist_ok=True)
            identity = Identity.generate()
            write_key(directory / "key.pem", identity, overwrite=True)
            settings = {
                "node": {"key": "key.pem", "data_dir": "data", "network": network, "listen": address},
                "discovery": {"bootstrap": [addresses[(index + 1) % count]] if count > 1 else [], **(discovery or {})},
                **((extra(index) if callable(extra) else extra) or {}),
            }
            spec = NodeSpec(index, directory, address, settings, identity.node_id)
            spec.config_path.write_text(tomli_w.dumps(settings))
            specs.append(spec)
        return cls(specs)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, spec: NodeSpec) -> None:
        log = open(spec.log_path, "ab")
        try:
            spec.process = subprocess.Popen(
                [*spec.prefix, sys.executable, "-m", "p2pnode", "start", "--config", str(spec.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()

    def start_all(self) -> None:
        for spec in self.specs:
            self.start(spec)

    def status(self, spec: NodeSpec, timeout: float = 2.0) -> dict | None:
        """The node's status, or None while it is not (yet, or any more) answering."""
        try:
            answer = request(spec.control_socket, "status", timeout=timeout)
        except ControlError:
            return None
        return answer.get("status") if answer.get("ok") else None

    def statuses(self) -> list[dict | None]:
        return [self.status(spec) for spec in self.specs]

    def alive(self, spec: NodeSpec) -> bool:
        return spec.process is not None and spec.process.poll() is None

    def kill(self, spec: NodeSpec, sig: int = signal.SIGKILL) -> None:
        if self.alive(spec):
            spec.process.send_signal(sig)
            spec.process.wait()

    def stop(self) -> dict[int, int | None]:
        """SIGTERM every running node, SIGKILL what is left after the grace period.
        Returns each node's exit code (None: it had to be killed)."""
        running = [spec for spec in self.specs if self.alive(spec)]
        for spec in running:
            spec.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        codes: dict[int, int | None] = {}
        for spec in running:
            try:
                codes[spec.index] = spec.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(spec.process.pid, signal.SIGKILL)
                spec.process.wait()
                codes[spec.index] = None
        return codes
