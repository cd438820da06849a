"""Hosts behind NAT routers and firewalls, built from Linux network namespaces (issue #46's testbed).

One namespace is the internet: a bridge on 198.51.100.0/24 (TEST-NET-2) that public hosts and
the routers' outside ends join. Each host is a namespace of its own, behind what its `Site` says:

- `public`: on the bridge, reachable by everyone;
- `firewall`: on the bridge, but its own iptables drop inbound connections it did not open
  (`INPUT` accepts `ESTABLISHED,RELATED` only): reachable by nobody, as behind a host firewall;
- `port-restricted`: behind a home router that masquerades its hosts (10.N.0.0/24) and forwards
  inbound only what belongs to a connection they opened (`MASQUERADE` + `ESTABLISHED,RELATED`),
  dropping the rest without a reset: one mapping per source port, whatever the destination;
- `symmetric`: the same router with `MASQUERADE --random-fully`: a new outside port per
  connection, so what one peer observes tells another nothing;
- `double`: a home router behind a carrier-grade one (100.64.N.0/24 between, RFC 6598), both
  masquerading.

Hosts of one router share it (its inside is a bridge), as devices behind one home router do.
`simultaneous_open(a, b)` tries hole punching between two hosts (TCP simultaneous open at the
address and port each would be seen from). `flush(router)` runs `conntrack -F` there: every
mapping expires at once, as when a router restarts or a mapping idles out (`survives_flush`: does
an open connection outlive it). Needs root, `ip
netns`, `iptables` and `conntrack` (`apt-get install iptables conntrack`); `missing()` says what
is not there. Namespaces and links carry a random tag and are removed on `close`, so runs side by
side do not meet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .cluster import Cluster
from .placement import LocalPlacement

__all__ = [
    "SITES",
    "STRANGER_PREFIX",
    "Host",
    "NatLab",
    "NatPlacement",
    "cluster_on",
    "missing",
    "observed",
    "simultaneous_open",
    "survives_flush",
    "tcp_reaches",
]

SITES = ("public", "firewall", "port-restricted", "symmetric", "double")
INTERNET_PREFIX = "198.51.100"  # TEST-NET-2: never routed outside this testbed
STRANGER_PREFIX = "203.0.113"  # TEST-NET-3: a /24 of the bridge's that no node but a stranger's is in
COMMAND_TIMEOUT_S = 10
# Inbound only what belongs to a connection opened from inside: a router's FORWARD, a firewall's INPUT.
ESTABLISHED = ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")


def missing() -> str | None:
    """Why the testbed cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and iptables)"
    for tool in ("ip", "iptables", "conntrack"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2 iptables conntrack)"
    return None


@dataclass(frozen=True)
class Host:
    name: str
    site: str
    namespace: str
    address: str  # its own address (behind a NAT, a private one nobody outside can reach)
    router: str | None = None  # the namespace of the router it sits behind (the outer one if double)
    seen_from: str = ""  # the address the internet sees its connections come from (its router's, behind a NAT)

    @property
    def prefix(self) -> tuple[str, ...]:
        """Run a command on this host."""
        return ("ip", "netns", "exec", self.namespace)


@dataclass
class NatLab:
    """The internet bridge and every host and router added to it; `close` removes them all."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    hosts: list[Host] = field(default_factory=list)
    routers: list[str] = field(default_factory=list)  # every router namespace, outer ones too
    _outer: dict[str, str] = field(default_factory=dict)  # a double NAT's home router → its carrier's
    _lan: dict[str, str] = field(default_factory=dict)  # a router → its inside network's first three octets
    _wan: dict[str, str] = field(default_factory=dict)  # a router on the bridge → its address there
    _namespaces: list[str] = field(default_factory=list)
    _outside: dict[str, int] = field(default_factory=lambda: defaultdict(lambda: 10))  # the next address, per /24

    def __post_init__(self) -> None:
        self.internet = self._namespace("inet")
        self._ip(self.internet, "link", "add", "br0", "type", "bridge")
        self._ip(self.internet, "link", "set", "br0", "up")

    def __enter__(self) -> NatLab:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for namespace in reversed(self._namespaces):
            self._run(None, "ip", "netns", "del", namespace, check=False)
        self._namespaces.clear()

    # --- hosts -------------------------------------------------------------------------------

    def add(self, name: str, site: str, router: str | None = None, *, prefix: str = INTERNET_PREFIX) -> Host:
        """A host at `site`; behind a NAT, behind `router` (from `add_router`) or a router of its own;
        on the bridge (public, firewall), in the /24 `prefix` (another one than the others': a
        stranger's subnet of its own)."""
        if site not in SITES:
            raise ValueError(f"unknown site {site!r}; choose from {', '.join(SITES)}")
        namespace = self._namespace(name)
        if site in ("public", "firewall"):
            address = self._on_internet(namespace, prefix)
            if site == "firewall":
                self._firewall(namespace)
            host = Host(name, site, namespace, address, seen_from=address)
        else:
            router = router or self.add_router(site)
            address, outermost = self._behind(router, namespace), self._outermost(router)
            host = Host(name, site, namespace, address, router=outermost, seen_from=self._wan[outermost])
        self.hosts.append(host)
        return host

    def add_router(self, site: str) -> str:
        """A NAT router of kind `site` (port-restricted, symmetric, double) with an empty inside."""
        if site == "double":
            carrier = self._router(self._namespace("cgn"), inside=f"100.64.{len(self.routers)}", random_ports=False)
            home = self._namespace("home")
            self._link(carrier, "in0", home, "out0")
            self._inside_address(carrier, home)
            self._outer[home] = carrier
            return self._router(home, inside=f"10.{len(self.routers)}.0", random_ports=False, outside_done=True)
        if site not in ("port-restricted", "symmetric"):
            raise ValueError(f"{site!r} is not a NAT")
        return self._router(
            self._namespace("nat"), inside=f"10.{len(self.routers)}.0", random_ports=site == "symmetric"
        )

    def forward(self, host: Host, *ports: int) -> None:
        """Forward `ports` of `host`'s router's public address to `host` (a home router's port
        forwarding: inbound connections to them get through). One NAT only, not a double one."""
        if host.router is None or host.router in self._outer.values():
            raise ValueError(f"{host.name} is not behind a NAT of its own that could forward ports")
        for port in ports:
            to = ("-p", "tcp", "--dport", str(port))
            dnat = ("-j", "DNAT", "--to-destination", f"{host.address}:{port}")
            self._run(host.router, "iptables", "-t", "nat", "-A", "PREROUTING", "-i", "out0", *to, *dnat)
            self._run(
                host.router, "iptables", "-I", "FORWARD", "1", "-i", "out0", "-d", host.address, *to, "-j", "ACCEPT"
            )

    def flush(self, router: str | None = None) -> None:
        """Expire the NAT mappings of `router` (every router: None), as `conntrack -F` does."""
        for namespace in self.routers if router is None else [router]:
            self._run(namespace, "conntrack", "-F", check=False)

    # --- building blocks ---------------------------------------------------------------------

    def _namespace(self, role: str) -> str:
        namespace = f"p2p{role}{len(self._namespaces)}{self.tag}"[:15]
        self._run(None, "ip", "netns", "add", namespace)
        self._namespaces.append(namespace)
        self._ip(namespace, "link", "set", "lo", "up")
        return namespace

    def _on_internet(self, namespace: str, prefix: str = INTERNET_PREFIX) -> str:
        """Join `namespace` to the bridge, at the next address of /24 `prefix`; its address there.
        Every address is on the bridge's one link: a default route onto it reaches other /24s too."""
        self._link(self.internet, f"p{len(self._namespaces)}", namespace, "out0", bridge="br0")
        address = f"{prefix}.{self._outside[prefix]}"
        self._outside[prefix] += 1
        self._ip(namespace, "addr", "add", f"{address}/24", "dev", "out0")
        self._ip(namespace, "route", "add", "default", "dev", "out0")
        return address

    def _router(self, namespace: str, *, inside: str, random_ports: bool, outside_done: bool = False) -> str:
        """Make `namespace` a masquerading router: outside on the bridge (or already linked), inside
        a bridge on `inside`.0/24 with itself at .1."""
        if not outside_done:
            self._wan[namespace] = self._on_internet(namespace)
        self._ip(namespace, "link", "add", "lan", "type", "bridge")
        self._ip(namespace, "addr", "add", f"{inside}.1/24", "dev", "lan")
        self._ip(namespace, "link", "set", "lan", "up")
        self._run(namespace, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        masquerade = ["-j", "MASQUERADE", *(["--random-fully"] if random_ports else [])]
        self._run(namespace, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "out0", *masquerade)
        for chain in ("FORWARD", "INPUT"):  # and no reset from the router itself for what it drops, as home routers do
            self._run(namespace, "iptables", "-A", chain, "-i", "out0", *ESTABLISHED)
            self._run(namespace, "iptables", "-A", chain, "-i", "out0", "-j", "DROP")
        self.routers.append(namespace)
        self._lan[namespace] = inside
        return namespace

    def _behind(self, router: str, namespace: str) -> str:
        """Put `namespace` on `router`'s inside bridge, its default route through the router."""
        count = sum(1 for host in self.hosts if host.router is not None) + 10
        inside = self._lan[router]
        self._link(router, f"h{len(self._namespaces)}", namespace, "out0", bridge="lan")
        address = f"{inside}.{count}"
        self._ip(namespace, "addr", "add", f"{address}/24", "dev", "out0")
        self._ip(namespace, "route", "add", "default", "via", f"{inside}.1")
        return address

    def _inside_address(self, carrier: str, home: str) -> None:
        """The home router's outside end on the carrier's inside bridge, default route through it."""
        inside = self._lan[carrier]
        self._ip(carrier, "link", "set", "in0", "master", "lan")
        self._ip(carrier, "link", "set", "in0", "up")
        self._ip(home, "addr", "add", f"{inside}.2/24", "dev", "out0")
        self._ip(home, "link", "set", "out0", "up")
        self._ip(home, "route", "add", "default", "via", f"{inside}.1")

    def _outermost(self, router: str) -> str:
        """The router whose outside faces the internet: a double NAT's carrier-grade one."""
        return self._outer.get(router, router)

    def _firewall(self, namespace: str) -> None:
        self._run(namespace, "iptables", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        self._run(namespace, "iptables", "-A", "INPUT", *ESTABLISHED)
        self._run(namespace, "iptables", "-A", "INPUT", "-j", "DROP")

    def _link(self, left: str, left_name: str, right: str, right_name: str, *, bridge: str | None = None) -> None:
        """A veth pair from `left` to `right`; the left end joins `left`'s `bridge`, if named."""
        temporary = f"v{uuid.uuid4().hex[:10]}"
        self._run(None, "ip", "link", "add", temporary, "type", "veth", "peer", "name", f"{temporary}x")
        for end, namespace, name in ((temporary, left, left_name), (f"{temporary}x", right, right_name)):
            self._run(None, "ip", "link", "set", end, "netns", namespace)
            self._ip(namespace, "link", "set", end, "name", name)
            self._ip(namespace, "link", "set", name, "up")
        if bridge is not None:
            self._ip(left, "link", "set", left_name, "master", bridge)

    def _ip(self, namespace: str, *args: str) -> str:
        return self._run(namespace, "ip", *args)

    def _run(self, namespace: str | None, *args: str, check: bool = True) -> str:
        """`args` in `namespace` (None: this one, where namespaces and links are made)."""
        inside = ("ip", "netns", "exec", namespace) if namespace is not None else ()
        result = subprocess.run([*inside, *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} in {namespace}: {result.stderr.strip() or result.returncode}")
        return result.stdout


class NatPlacement(LocalPlacement):
    """A launcher's placement (placement.py) of node i on `hosts[i]`, at `port` of its address
    (the namespaces are the lab's own, so a fixed port is free); with `client_mode`, a node not
    on the internet bridge runs in client mode (`[node].client_mode`). With `relay`, the first
    node (every other's bootstrap) relays for them (`[relay].enabled`), so client nodes reach
    each other; without one only the public nodes can be a client's peers, so it waits for no
    more of them before its first round. `relaying`: the node that relays (None: a relay that is
    none of these nodes', started apart and named in their bootstrap lists). Without
    `client_mode`, a node's own setting is left."""

    def __init__(
        self,
        hosts: list[Host],
        port: int = 7000,
        client_mode: bool = False,
        relay: bool = False,
        relaying: int | None = 0,
    ) -> None:
        super().__init__(fork=False)  # a daemon runs in its host's namespace: started with exec there
        self.hosts, self.port, self.client_mode, self.relay = hosts, port, client_mode, relay
        self.relaying = relaying

    def place(self, specs, timeout: float) -> None:
        for spec in specs:
            host = self.hosts[spec.index]
            spec.prefix = host.prefix
            spec.settings["node"]["listen"] = f"tcp://{host.address}:{self.port}"
            if self.relay and spec.index == self.relaying:
                spec.settings.setdefault("relay", {})["enabled"] = True
            if not (self.client_mode and host.site != "public"):
                continue
            spec.settings["node"]["client_mode"] = True
            algorithm = spec.settings.get("algorithm")
            if algorithm and "start_peers" in algorithm and not self.relay:
                public = sum(other.site == "public" for other in self.hosts)
                algorithm["start_peers"] = min(algorithm["start_peers"], public)


def cluster_on(
    hosts: list[Host],
    out: Path,
    *,
    port: int = 7000,
    discovery: dict | None = None,
    client_mode: bool = False,
    relay: bool = False,
) -> Cluster:
    """A launcher's cluster of one daemon per host, node i on `hosts[i]` at `port`, with
    `client_mode` behind the NATs and the first node relaying with `relay` (`NatPlacement`);
    the first started is the others' bootstrap."""
    placement = NatPlacement(hosts, port, client_mode, relay)
    return Cluster.prepare(out, len(hosts), discovery=discovery, placement=placement)


def tcp_reaches(source: Host, target: Host, port: int = 9, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection from `source` to `target`'s address is accepted (a probe of the
    testbed, not of p2pnode)."""
    return observed(source, target, port, timeout_s=timeout_s) is not None


def observed(
    source: Host, target: Host, port: int = 9, *, source_port: int = 0, timeout_s: float = 0.5
) -> tuple[str, int] | None:
    """The address and port `target` sees a TCP connection from `source` (from `source_port`,
    0: any) come from, or None if it never arrives: a listener on `target` for the one try."""
    listener = _start(target, _LISTEN, target.address, port, timeout_s + 2)
    try:
        assert listener.stdout.readline().strip() == "listening"
        connect = _command(source, _CONNECT, target.address, port, timeout_s, source_port)
        if subprocess.run(connect, capture_output=True, timeout=timeout_s + 5).returncode:
            return None  # refused or timed out: nothing reached the listener
        seen = listener.stdout.readline().split()
        return (seen[0], int(seen[1])) if len(seen) == 2 else None
    finally:
        _stop(listener)


def _command(host: Host, script: str, *args: object) -> list[str]:
    """Run the Python `script` on `host` with `args` (a probe: the testbed's, not p2pnode's)."""
    return [*host.prefix, sys.executable, "-I", "-S", "-c", script, *map(str, args)]


def _start(host: Host, script: str, *args: object, stdin: bool = False) -> subprocess.Popen:
    """`script` started on `host`, its output (and with `stdin`, its input) lines of text."""
    return subprocess.Popen(
        _command(host, script, *args),
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
    )


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


_LISTEN = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last probe's TIME_WAIT
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(float(sys.argv[3]))
print("listening", flush=True)
try:
    connection, peer = s.accept()
    print(peer[0], peer[1], flush=True)
except OSError:
    print("none", flush=True)
"""
_CONNECT = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.settimeout(float(sys.argv[3]))
s.bind(("", int(sys.argv[4]))); s.connect((sys.argv[1], int(sys.argv[2]))); s.close()
"""


def simultaneous_open(a: Host, b: Host, port: int = 41000, timeout_s: float = 6.0) -> bool:
    """Hole punching, as libp2p's DCUtR does it over TCP: `a` and `b` both connect from `port` to
    the other's `seen_from` at `port` at once, for `timeout_s` (a first SYN that reaches the
    other's router before that router has seen its own host's goes unanswered, and the kernel
    sends it again), and it works if one connection carries a byte each way. Each assumes the
    other keeps its port through its NAT, which a symmetric NAT does not: no exchange of
    addresses could tell it the port to aim at (a probe of the testbed, not of p2pnode)."""
    tries = [_start(host, _PUNCH, port, peer.seen_from, timeout_s) for host, peer in ((a, b), (b, a))]
    said = [punch.communicate(timeout=timeout_s + 10)[0].strip() for punch in tries]
    return said == ["ok", "ok"]


_PUNCH = """
import socket, sys, time
port, peer, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
said = "none"
while time.monotonic() < deadline:  # one socket while it waits: the kernel resends its SYN (1 s, 3 s)
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(max(0.1, deadline - time.monotonic())); s.bind(("", port))
    try:
        s.connect((peer, port)); s.sendall(b"x")
        said = "ok" if s.recv(1) == b"x" else "closed"
        break
    except ConnectionRefusedError:  # a reset (a SYN that came while no socket was there): again
        s.close(); time.sleep(0.1)
    except OSError:
        break
print(said, flush=True)
"""


def survives_flush(lab: NatLab, inside: Host, server: Host, port: int = 9100) -> bool:
    """Whether a TCP connection from `inside` to `server`, open and used, still carries a byte
    each way after `lab.flush()` expired every mapping, `inside` sending first (as a peer's
    keep-alive would): a router that keeps ports maps it again as it was; one that draws a new
    port per connection shows the server a stranger, which resets it (a probe of the testbed)."""
    echo = _start(server, _ECHO, server.address, port)
    client = None
    try:
        assert echo.stdout.readline().strip() == "listening"
        client = _start(inside, _PINGS, server.address, port, stdin=True)  # it connects at once

        def exchange() -> bool:
            client.stdin.write("go\n")
            client.stdin.flush()
            return client.stdout.readline().strip() == "ok"

        if not exchange():
            raise RuntimeError(f"no connection from {inside.name} to {server.name} before the flush")
        lab.flush()
        return exchange()
    finally:
        if client is not None:
            _stop(client)
        _stop(echo)


_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("listening", flush=True)
c, _ = s.accept()
while (data := c.recv(64)):
    c.sendall(data)
"""
_PINGS = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); s.settimeout(5)
for _ in sys.stdin:
    try:
        s.sendall(b"x"); print("ok" if s.recv(1) == b"x" else "closed", flush=True)
    except OSError:
        print("reset", flush=True)
"""
