"""Where a testnet's daemons run: the one seam between the launcher (`testnet/launch/cluster.py`:
keys, configs, the bootstrap, start order, stops, churn) and the processes it launches.

A placement starts a node's `p2pnode start` process, hands back a handle to signal and reap it
(`DaemonProcess`, the part of `subprocess.Popen` the launcher uses), reads the node's status on
its control socket and brings its log to `NodeSpec.log_path`. `LocalPlacement` runs every
daemon on this machine (forked from a warm parent, testnet/launch/warm_parent.py; one in a
network namespace a child of the launcher); `testnet/launch/raynodes.py` runs each on a node of
a Ray cluster, through a launcher actor there that does on its node what `LocalPlacement` does
here (`spawn_daemon`, `read_status`). Nothing else differs between the two engines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from p2pnode.forkserver import die_with_parent
from p2pnode.operations.control import ControlError, request

from .warm_parent import WarmParent

__all__ = [
    "NodeSpec",
    "DAEMON",
    "DaemonProcess",
    "Placement",
    "LocalPlacement",
    "PlacementError",
    "spawn_daemon",
    "read_status",
]

DAEMON = ("p2pnode_cli", "start")  # what `python -m` runs for a node: the daemon


@dataclass
class NodeSpec:
    index: int
    directory: Path
    settings: dict  # the TOML document, as a dict; `Cluster.start` writes it to config_path
    node_id: str = ""
    public_key: bytes = b""  # its Ed25519 key, named in the bootstrap entries that point at it
    prefix: tuple[str, ...] = ()  # run the daemon under this, e.g. ("ip", "netns", "exec", "host1")
    # The module and arguments `python -m` runs with `--config`: a rehearsal's Byzantine node
    # is ("testnet.launch.byzantine", "--attack", …) (testnet/launch/byzantine.py).
    program: tuple[str, ...] = DAEMON
    address: str | None = None  # the address the node reported in its status; None until it has
    process: DaemonProcess | None = field(default=None, repr=False)

    @property
    def config_path(self) -> Path:
        return self.directory / "node.toml"

    @property
    def control_socket(self) -> Path:
        return self.directory / "data" / "control.sock"

    @property
    def log_path(self) -> Path:
        return self.directory / "node.log"


class DaemonProcess(Protocol):
    """A started daemon, as the launcher sees it (`subprocess.Popen`'s names and meanings)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; raises `subprocess.TimeoutExpired` if it runs on past `timeout`."""
        ...

    def send_signal(self, sig: int) -> None: ...

    def kill_group(self) -> None:
        """SIGKILL the daemon and anything it started (its process group)."""
        ...


class Placement(Protocol):
    engine: str  # "local" or "ray": recorded in the reports

    def place(self, specs: Sequence[NodeSpec], timeout: float) -> None:
        """Decide where each node runs, before its config is written, and make its settings fit
        (`[node].listen` on that host's address); a node keeps its place for the whole run, so
        that a restarted daemon finds its data directory again."""
        ...

    def spawn(self, spec: NodeSpec) -> DaemonProcess:
        """Start the daemon of `spec.config_path`, its output appended to its log."""
        ...

    def statuses(self, specs: Sequence[NodeSpec], timeout: float) -> list[dict | None]:
        """Each node's status (None: not answering), in the order of `specs`."""
        ...

    def collect(self, specs: Iterable[NodeSpec]) -> None:
        """Bring each node's log to its `log_path` on this machine (where it is not already)."""
        ...

    def lost(self, spec: NodeSpec) -> bool:
        """The daemon died with the place it ran (a Ray node or worker), which cannot start it
        again: `--restart` leaves it down."""
        ...

    def close(self) -> None:
        """Release what the placement holds, once the cluster has stopped its daemons."""
        ...


class PlacementError(RuntimeError):
    """The engine failed at run time (its cluster unreachable, a launcher not answering)."""


class _Daemon(subprocess.Popen):
    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole group is gone already


def spawn_daemon(spec: NodeSpec) -> DaemonProcess:
    """`p2pnode start` (or `spec.program`) for `spec`, a child of this process: in its own session, so that a
    terminal's Ctrl-C reaches the launcher alone, and with PR_SET_PDEATHSIG, so that it dies
    with the launcher even if the launcher is killed with SIGKILL."""
    with open(spec.log_path, "ab") as log:  # the child keeps its own descriptor
        return _Daemon(
            [*spec.prefix, sys.executable, "-m", *spec.program, "--config", str(spec.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def learns(spec: NodeSpec) -> bool:
    """The node runs a learning algorithm (its `[algorithm].name` is not `none`)."""
    return spec.settings.get("algorithm", {}).get("name", "none") != "none"


def read_status(control_socket: Path, timeout: float) -> dict | None:
    """The node's status from its control socket, or None while it is not answering."""
    try:
        answer = request(control_socket, "status", timeout=timeout)
    except ControlError:
        return None
    return answer.get("status") if answer.get("ok") else None


class LocalPlacement:
    """Every daemon on this machine, forked from this thread's warm parent of its kind
    (testnet/launch/warm_parent.py: the imports every such daemon makes, done once); one in a
    network namespace, or every one with `fork=False`, a child of the launcher started with exec."""

    engine = "local"

    def __init__(self, fork: bool = True) -> None:
        self.fork = fork

    def place(self, specs: Sequence[NodeSpec], timeout: float) -> None:
        pass  # here, as configured

    def spawn(self, spec: NodeSpec) -> DaemonProcess:
        if not self.fork or spec.prefix:
            return spawn_daemon(spec)
        parent = WarmParent.shared(learning=learns(spec))
        return parent.spawn(spec.program, ["--config", str(spec.config_path)], spec.log_path)

    def statuses(self, specs: Sequence[NodeSpec], timeout: float) -> list[dict | None]:
        return [read_status(spec.control_socket, timeout) for spec in specs]

    def collect(self, specs: Iterable[NodeSpec]) -> None:
        pass  # the daemons write their logs in place

    def lost(self, spec: NodeSpec) -> bool:
        return False  # this machine is where the launcher runs: it is here as long as the run is

    def close(self) -> None:
        pass  # the warm parents are this thread's, for its next testnet too; the cluster stopped the daemons

    def __enter__(self) -> LocalPlacement:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
