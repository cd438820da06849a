"""`p2pnode testnet --engine ray`: the daemons run on the nodes of a Ray cluster.

One launcher actor per Ray node (`NodeLauncher`, pinned to its node) does there what
`LocalPlacement` does here: it writes each daemon's config and key into a private directory on
its node, starts `p2pnode start` as its own child (`spawn_daemon`: PR_SET_PDEATHSIG, its own
session), signals and reaps it, reads its status on its control socket and hands back its log.
The control socket stays a Unix socket on that node: the launcher relays what the driver asks,
so no daemon opens a control port to the network. Each daemon listens on its node's address
(the one the node joined Ray with) on ports the OS picks, and speaks TCP (CURVE on) to its
peers on the other nodes, as on separate machines.

Daemons are spread over the nodes alive when the run starts, in proportion to their CPUs (node
after node, the next daemon goes where daemons per CPU would stay lowest); a node with no CPU
gets none. A daemon keeps its node for the whole run, so that a restart (churn) finds its data
directory and checkpoint again. The code the launchers run is the driver's: the packages ship
with each actor (`py_modules`), so the nodes need only the same Python dependencies.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import algorithms
import p2pnode
import protocol
import testnet

from .cluster import ClusterStartError
from .placement import DAEMON, NodeSpec, PlacementError, read_status, spawn_daemon

__all__ = ["RayPlacement", "NodeLauncher", "LOST", "code", "next_node"]

LOST = -1  # the exit code recorded for a daemon whose launcher was lost (its Ray node or worker died)
CONNECT_TIMEOUT_S = 5.0  # the most a TCP connection to `--ray-address` may take before Ray is asked to join it
CALL_TIMEOUT_S = 30.0  # the most a launcher may take to answer one call (beyond what the call waits itself)
LOG_BYTES = 16 * 2**20  # the most of one daemon's log brought back to the driver (its end)


@ray.remote(num_cpus=0, max_restarts=0)
class NodeLauncher:
    """On one Ray node: the daemons placed there, each a child of this actor's process (which
    runs its methods on its main thread, the thread PR_SET_PDEATHSIG watches)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="p2pnode-ray-"))  # mode 0700: keys go in it
        self.daemons: dict[int, tuple[NodeSpec, Any]] = {}

    def ready(self) -> str:
        return str(self.root)

    def spawn(self, index: int, name: str, files: dict[str, bytes]) -> int:
        """Write the daemon's files (config, key) under its directory and start it; returns its pid."""
        if index in self.daemons and self.daemons[index][1].poll() is None:
            raise RuntimeError(f"node {index} is still running on this Ray node")
        spec = NodeSpec(index, self.root / name, {})
        for relative, data in files.items():
            path = spec.directory / relative
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.touch(mode=0o600)
            path.write_bytes(data)
        process = spawn_daemon(spec)
        self.daemons[index] = (spec, process)
        return process.pid

    def poll(self, index: int) -> int | None:
        return self.daemons[index][1].poll()

    def signal(self, index: int, sig: int) -> None:
        process = self.daemons[index][1]
        if process.poll() is None:
            process.send_signal(sig)

    def wait(self, index: int, timeout: float | None) -> int | None:
        """The exit code, or None if the daemon still runs after `timeout` seconds."""
        try:
            return self.daemons[index][1].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self, index: int) -> None:
        self.daemons[index][1].kill_group()

    def statuses(self, indices: list[int], timeout: float) -> list[tuple[dict | None, int | None]]:
        """Each daemon's status and exit code (None: running), read one after another."""
        return [(read_status(self.daemons[i][0].control_socket, timeout), self.daemons[i][1].poll()) for i in indices]

    def log(self, index: int, limit: int) -> bytes:
        path = self.daemons[index][0].log_path
        try:
            with open(path, "rb") as log:
                log.seek(max(0, path.stat().st_size - limit))
                return log.read(limit)
        except FileNotFoundError:
            return b""

    def close(self) -> None:
        """Kill what still runs (the cluster has stopped the daemons in order already) and remove
        the directories, keys included."""
        for _, process in self.daemons.values():
            if process.poll() is None:
                process.kill_group()
                process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _get(ref, timeout: float | None, what: str):
    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise PlacementError(f"{what} did not answer within {timeout:g} s") from None


def _answers(address: str) -> None:
    """Something listens at `host:port` (Ray itself retries a dead address for many minutes);
    other forms (`auto`, `ray://...`) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise PlacementError(f"nothing answers at the Ray address {address}: {exc.strerror or exc}") from None


class RayProcess:
    """A daemon on a Ray node, through its node's launcher (`DaemonProcess`)."""

    def __init__(self, launcher, host: str, index: int, pid: int) -> None:
        self.launcher, self.host, self.index, self.pid = launcher, host, index, pid
        self.returncode: int | None = None

    def _call(self, method: str, *args, wait_s: float = 0.0):
        """Call the launcher about this daemon; None, and the daemon counted as lost (`LOST`),
        if the launcher is gone: the daemon died with it."""
        ref = getattr(self.launcher, method).remote(self.index, *args)
        try:
            return _get(ref, wait_s + CALL_TIMEOUT_S, f"the Ray launcher on {self.host}")
        except RayActorError:
            self.returncode = LOST
            return None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._call("poll")
            self.returncode = self.returncode if code is None else code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._call("wait", timeout, wait_s=timeout or 0.0)
            if code is None and self.returncode is None:
                raise subprocess.TimeoutExpired(f"node {self.index} on {self.host}", timeout)
            self.returncode = self.returncode if code is None else code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self._call("signal", int(sig))

    def kill_group(self) -> None:
        if self.returncode is None:
            self._call("kill_group")


def next_node(load: Sequence[int], cpus: Sequence[float]) -> int:
    """Where the next daemon goes: the node whose daemons per CPU stay lowest with it (the first
    such node on a tie), given the daemons each node has and its CPUs (all above 0)."""
    return min(range(len(load)), key=lambda i: ((load[i] + 1) / cpus[i], i))


def code() -> dict[str, Any]:
    """The job's runtime environment: the driver's packages, zipped and shipped by Ray to every
    node that runs a launcher (a job can only ship directories when it joins Ray)."""
    return {"py_modules": [p2pnode, protocol, algorithms, testnet]}


class RayPlacement:
    """Daemons on the nodes of a Ray cluster (`Placement`); see the module's docstring."""

    engine = "ray"

    def __init__(self, owns_ray: bool) -> None:
        self.owns_ray = owns_ray  # started or connected by us: shut down by us
        self.launchers: list[tuple[str, Any, float]] = []  # (node address, launcher, CPUs), by address
        self.placed: dict[int, int] = {}  # node index → launcher index

    @classmethod
    def connect(cls, address: str | None, *, progress) -> RayPlacement:
        """Join the Ray cluster at `address`, or start a local Ray instance (`address` None),
        shipping this code (`code()`); a Ray this process has joined already is used as it is
        (it must ship the code itself, or the nodes have it)."""
        if ray.is_initialized():
            return cls(owns_ray=False)
        print(f"connecting to the Ray cluster at {address}" if address else "starting a local Ray", file=progress)
        if address:
            _answers(address)
        try:
            ray.init(
                address=address or "local",
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,  # Ray's own progress lines; the run prints its own
                runtime_env=code(),
            )
        except Exception as exc:  # Ray raises several kinds here (ConnectionError, RuntimeError, ValueError...)
            raise PlacementError(f"cannot {'reach Ray at ' + address if address else 'start Ray'}: {exc}") from None
        return cls(owns_ray=True)

    def _start_launchers(self, timeout: float) -> None:
        nodes = sorted(
            (node["NodeManagerAddress"], node["NodeID"], node["Resources"].get("CPU", 0.0))
            for node in ray.nodes()
            if node["Alive"]
        )
        usable = [node for node in nodes if node[2] > 0]
        if not usable:
            raise ClusterStartError(f"no Ray node with a CPU to run daemons on (nodes: {nodes})")
        launchers = [
            NodeLauncher.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
            for _, node_id, _ in usable
        ]
        try:
            ray.get([launcher.ready.remote() for launcher in launchers], timeout=timeout)
        except GetTimeoutError:
            raise ClusterStartError(f"the Ray launchers did not start within {timeout:g} s") from None
        self.launchers = [(host, launcher, cpus) for (host, _, cpus), launcher in zip(usable, launchers, strict=True)]

    def place(self, specs: Sequence[NodeSpec], timeout: float) -> None:
        if not self.launchers:
            self._start_launchers(timeout)
        load = [0] * len(self.launchers)
        for where in self.placed.values():
            load[where] += 1
        for spec in specs:
            if spec.prefix or spec.program != DAEMON:
                raise ClusterStartError(f"node {spec.index}: a command prefix or program runs on this machine only")
            if spec.index not in self.placed:
                where = next_node(load, [cpus for _, _, cpus in self.launchers])
                self.placed[spec.index] = where
                load[where] += 1
            node = spec.settings.setdefault("node", {})
            port = node.get("listen", "tcp://127.0.0.1:0").rsplit(":", 1)[1]
            node["listen"] = f"tcp://{self.host(spec)}:{port}"

    def host(self, spec: NodeSpec) -> str:
        return self.launchers[self.placed[spec.index]][0]

    def _launcher(self, spec: NodeSpec):
        return self.launchers[self.placed[spec.index]][1]

    def spawn(self, spec: NodeSpec) -> RayProcess:
        key = Path(spec.settings["node"]["key"])
        if key.is_absolute():
            raise ClusterStartError(f"node {spec.index}: [node].key must be relative to the config to travel")
        files = {spec.config_path.name: spec.config_path.read_bytes(), str(key): (spec.directory / key).read_bytes()}
        pid = _get(
            self._launcher(spec).spawn.remote(spec.index, spec.directory.name, files),
            CALL_TIMEOUT_S,
            f"the Ray launcher on {self.host(spec)}",
        )
        return RayProcess(self._launcher(spec), self.host(spec), spec.index, pid)

    def statuses(self, specs: Sequence[NodeSpec], timeout: float) -> list[dict | None]:
        """One call per Ray node, all at once; a node's launcher reads its daemons in turn."""
        asked = [spec for spec in specs if isinstance(spec.process, RayProcess)]
        groups: dict[int, list[NodeSpec]] = {}
        for spec in asked:
            groups.setdefault(self.placed[spec.index], []).append(spec)
        refs = {
            where: self.launchers[where][1].statuses.remote([spec.index for spec in group], timeout)
            for where, group in groups.items()
        }
        found: dict[int, dict | None] = {}
        for where, group in groups.items():
            wait_s = timeout * len(group) + CALL_TIMEOUT_S
            try:
                answers = _get(refs[where], wait_s, f"the Ray launcher on {self.launchers[where][0]}")
            except RayActorError:
                answers = [(None, LOST)] * len(group)
            for spec, (status, code) in zip(group, answers, strict=True):
                found[spec.index] = status
                if code is not None and spec.process.returncode is None:
                    spec.process.returncode = code
        return [found.get(spec.index) for spec in specs]

    def lost(self, spec: NodeSpec) -> bool:
        return isinstance(spec.process, RayProcess) and spec.process.returncode == LOST

    def collect(self, specs: Iterable[NodeSpec]) -> None:
        for spec in specs:
            if not isinstance(spec.process, RayProcess):
                continue
            try:
                data = _get(
                    self._launcher(spec).log.remote(spec.index, LOG_BYTES),
                    CALL_TIMEOUT_S,
                    f"the Ray launcher on {self.host(spec)}",
                )
            except RayActorError:
                continue  # gone with its node: the log went with it
            spec.log_path.write_bytes(data)

    def close(self) -> None:
        try:
            ray.get([launcher.close.remote() for _, launcher, _ in self.launchers], timeout=CALL_TIMEOUT_S)
        except (GetTimeoutError, RayActorError):
            pass  # killing the actor below kills its daemons too (PR_SET_PDEATHSIG)
        for _, launcher, _ in self.launchers:
            ray.kill(launcher)
        self.launchers, self.placed = [], {}
        if self.owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayPlacement:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
