"""Many real daemons: keys and configs on disk, one process each, and a guarantee that every
process is gone when the cluster is (`with Cluster(...)`).

No port is chosen in advance: every daemon listens on port 0, the OS picks a free port when it
binds, and the launcher reads the address back from the node's status. The first node started
is the bootstrap of all the others (see `Cluster.start`). Generated configs turn CURVE on
(`[security].curve`): the launcher made every key, so it names each bootstrap peer's key too.

Where the processes run is the placement's business (`testnet/launch/placement.py`): children of this
process by default, or on the nodes of a Ray cluster (`testnet/launch/raynodes.py`). Either way a
child gets PR_SET_PDEATHSIG, so even a launcher killed with SIGKILL leaves no daemon behind,
and runs in its own session, so a terminal's Ctrl-C reaches the launcher alone, which then
stops them in order (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import tomli_w

from p2pnode.wire.keystore import write_key
from protocol import Identity
from protocol.messages import is_client_address

from .placement import LocalPlacement, NodeSpec, Placement

__all__ = ["NodeSpec", "Cluster", "ClusterStartError"]

# Daemons starting at once (spawned, not answering yet). A daemon's start costs about 0.75 s of
# CPU (imports, config check, sequence reservation): 99 at once on 2 cores kept the machine
# saturated for a minute, in which the first ones' handshakes timed out (issue #16).
START_AT_ONCE = 4 * (os.cpu_count() or 1)


class ClusterStartError(RuntimeError):
    """The first node, which every other node joins through, exited or did not answer in time;
    or the placement found nowhere to run a node."""


def _security(count: int) -> dict:
    """CURVE on; every node of the testnet connects from this one host, some twice for a while
    (a restarted peer's old connection lingers until TCP finds it closed): caps to fit."""
    caps = max(4 * count, 64)
    return {"curve": True, "max_connections": max(caps, 1024), "max_connections_per_address": caps}


class Cluster:
    def __init__(
        self,
        specs: list[NodeSpec],
        stop_grace_s: float = 10.0,
        start_timeout_s: float = 30.0,
        placement: Placement | None = None,
        exit_grace_s: float = 60.0,
    ) -> None:
        self.specs = specs
        self.placement = placement or LocalPlacement()
        self._owns_placement = placement is None  # closed with the cluster (its fork server)
        self.stop_grace_s = stop_grace_s  # from SIGTERM until the node has stopped
        self.exit_grace_s = exit_grace_s  # and then until its process has exited
        self.start_timeout_s = start_timeout_s
        self.bootstrap: str | None = None  # the first node started (`KEY@address`); the others join it

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
        placement: Placement | None = None,
        identities: Callable[[int], Identity] | None = None,
    ) -> Cluster:
        """Write a key and a config per node under `out`, each listening on port 0 of `host`,
        with CURVE on and connection caps that fit `count` nodes on one host.
        `[discovery].bootstrap` is left out: `start` fills it in. `extra` adds sections, or
        settings to the sections above: one document for all nodes, or a function of the node
        index. `placement` runs the daemons (default: here, `LocalPlacement`), and may move
        `host` to where each one runs. `identities` gives node i's key (default: a new one)."""
        specs = []
        for index in range(count):
            directory = out / f"node{index:02d}"
            directory.mkdir(parents=True, exist_ok=True)
            identity = Identity.generate() if identities is None else identities(index)
            write_key(directory / "key.pem", identity, overwrite=True)
            settings = {
                "node": {"key": "key.pem", "data_dir": "data", "network": network, "listen": f"tcp://{host}:0"},
                "discovery": dict(discovery or {}),
                "security": _security(count),
            }
            for section, table in ((extra(index) if callable(extra) else extra) or {}).items():
                settings[section] = {**settings.get(section, {}), **table}
            spec = NodeSpec(index, directory, settings, identity.node_id, identity.public_key)
            spec.config_path.write_text(tomli_w.dumps(settings))
            specs.append(spec)
        return cls(specs, placement=placement)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            if self._owns_placement:
                self.placement.close()

    def start(self, spec: NodeSpec) -> None:
        """Write the node's config from `spec.settings` and spawn its daemon.

        The first node this cluster starts, whichever it is, is the bootstrap of the others:
        `start` waits until it answers status (`wait_until_up`) and keeps its address in
        `self.bootstrap`. A node whose settings name no `[discovery].bootstrap` gets that address
        as its only bootstrap peer (the first node itself gets none); settings that name one,
        even an empty list, are kept. A node that has run before (`spec.address` known) comes back
        on the same address: its `listen` is rewritten to it, as a restarted daemon would come
        back on its configured port.
        """
        self.placement.place([spec], self.start_timeout_s)
        node = spec.settings.setdefault("node", {})
        if spec.address is not None and "advertise" not in node and not is_client_address(spec.address):
            node["listen"] = spec.address
        discovery = spec.settings.setdefault("discovery", {})
        if "bootstrap" not in discovery:
            discovery["bootstrap"] = [] if self.bootstrap is None else [self.bootstrap]
        spec.config_path.write_text(tomli_w.dumps(spec.settings))
        spec.process = self.placement.spawn(spec)
        if self.bootstrap is None:
            address = self.wait_until_up(spec)
            self.bootstrap = f"{spec.public_key.hex()}@{address}" if spec.public_key else address

    def place(self) -> None:
        """Decide where every node runs, all at once (`start` places one node it finds unplaced)."""
        self.placement.place(self.specs, self.start_timeout_s)

    def start_all(self, at_once: int = START_AT_ONCE) -> None:
        """Start every node: the first alone, until it answers (see `start`), then the others,
        at most `at_once` of them starting at a time. Each joins through the first and through
        one node started before it that answers (drawn with a fixed seed), so that the first is
        not the only way in: with 100 daemons its handshakes became the bottleneck of the join.
        All are placed first, together."""
        self.place()
        starting: list[tuple[NodeSpec, float]] = []  # and when it was spawned
        draw = random.Random(len(self.specs))
        for spec in self.specs:
            discovery = spec.settings.setdefault("discovery", {})
            up = [
                other
                for other in self.specs[1 : spec.index]
                if other.address is not None and not is_client_address(other.address) and self.alive(other)
            ]  # a client node is dialled by nobody
            if self.bootstrap is not None and up and "bootstrap" not in discovery:
                contact = draw.choice(up)
                named = f"{contact.public_key.hex()}@{contact.address}" if contact.public_key else contact.address
                discovery["bootstrap"] = [self.bootstrap, named]
            while len(starting) >= at_once:
                # Still starting: alive, silent, and not past start_timeout_s (then it is the
                # run's to notice, not the start's to wait for).
                starting = [
                    (s, at)
                    for s, at in starting
                    if self.alive(s)
                    and time.monotonic() - at < self.start_timeout_s
                    and self.status(s, timeout=1.0) is None
                ]
                if len(starting) >= at_once:
                    time.sleep(0.05)
            self.start(spec)
            starting.append((spec, time.monotonic()))

    def wait_until_up(self, spec: NodeSpec, timeout: float | None = None) -> str:
        """Wait until the node answers status; returns its address. Raises ClusterStartError,
        naming the node's log, if it exits first or does not answer within `timeout` seconds
        (default `start_timeout_s`)."""
        timeout = self.start_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while (status := self.status(spec, timeout=1.0)) is None:
            if not self.alive(spec):
                code = None if spec.process is None else spec.process.returncode
                raise ClusterStartError(
                    f"node {spec.index} exited (code {code}) before it answered; see {self.log(spec)}"
                )
            if time.monotonic() >= deadline:
                raise ClusterStartError(f"node {spec.index} did not answer within {timeout:g} s; see {self.log(spec)}")
            time.sleep(0.05)
        return status["address"]

    def status(self, spec: NodeSpec, timeout: float = 2.0) -> dict | None:
        """The node's status, or None while it is not (yet, or any more) answering. The address
        it reports is kept in `spec.address`."""
        return self.statuses([spec], timeout)[0]

    def statuses(self, specs: list[NodeSpec] | None = None, timeout: float = 2.0) -> list[dict | None]:
        """`status` of each node (default: all), in order."""
        specs = self.specs if specs is None else specs
        statuses = self.placement.statuses(specs, timeout)
        for spec, status in zip(specs, statuses, strict=True):
            if status and status.get("address"):
                spec.address = status["address"]
        return statuses

    def log(self, spec: NodeSpec) -> Path:
        """The node's log on this machine, brought up to date from where it runs."""
        self.placement.collect([spec])
        return spec.log_path

    def alive(self, spec: NodeSpec) -> bool:
        return spec.process is not None and spec.process.poll() is None

    def kill(self, spec: NodeSpec, sig: int = signal.SIGKILL, timeout: float | None = None) -> None:
        """Send `sig` and wait until the daemon is gone; SIGKILL it if it is still there after
        `timeout` seconds (None: wait as long as it takes)."""
        if self.alive(spec):
            if spec.address is None:
                self.status(spec, timeout=1.0)  # learn its address, so that `start` brings it back there
            spec.process.send_signal(sig)
            try:
                spec.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                spec.process.kill_group()
                spec.process.wait()

    def stop(self) -> dict[int, int | None]:
        """SIGTERM every running node, SIGKILL what is left after the grace period.
        Returns each started node's exit code (None: it had to be killed; a node that had
        already exited keeps its own code)."""
        running = [spec for spec in self.specs if self.alive(spec)]
        for spec in running:
            spec.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace_s
        stopping = {spec.index for spec in running}
        codes: dict[int, int | None] = {
            spec.index: spec.process.returncode
            for spec in self.specs
            if spec.process is not None and spec.index not in stopping
        }
        for spec in running:
            codes[spec.index] = self._exit_code(spec, deadline)
        self.placement.collect(spec for spec in self.specs if spec.process is not None)
        return codes

    def _exit_code(self, spec: NodeSpec, deadline: float) -> int | None:
        """The exit code of a node told to stop, or None if it had to be killed. A node whose
        control socket is gone has stopped (the socket closes with its nursery) and is only
        tearing down its interpreter, which on a loaded machine can outlast the grace period:
        it gets `exit_grace_s` more instead of being killed with its code lost."""
        process = spec.process
        try:
            return process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if not spec.control_socket.exists():
                try:
                    return process.wait(timeout=self.exit_grace_s)
                except subprocess.TimeoutExpired:
                    pass
        process.kill_group()
        process.wait()
        return None
