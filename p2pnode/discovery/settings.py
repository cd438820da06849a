"""[discovery] and [beacon]: how the node finds, admits and keeps its peers."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from protocol.curve import curve_public_from_ed25519

from ..options import (
    BootstrapEntry,
    CheckContext,
    Flag,
    Integer,
    ListOf,
    Network,
    Number,
    Section,
    Text,
    option,
    split_bootstrap,
)


@dataclass(frozen=True, kw_only=True)
class DiscoverySettings(Section):
    bootstrap: tuple[str, ...] = option(
        ListOf(BootstrapEntry(), 256),
        (),
        "peers to contact at start; retried with backoff until they answer, and again whenever they are "
        "lost; with `[security].curve` each entry names the peer's key (`p2pnode keyinfo`)",
    )
    max_peers: int = option(
        Integer(1, 4096),
        64,
        "peer table bound (the active view: connected and pinged peers); a verified newcomer beyond it "
        "is sent a sample of the peers and a BYE (`full`) instead",
    )
    active_view: int = option(
        Integer(1, 4096),
        64,
        "peers this node seeks: while it has fewer, it verifies addresses from its passive view "
        "(at most max_peers; for a large network set it below max_peers, e.g. 8 and 10: docs/daemon.md)",
    )
    passive_view: int = option(
        Integer(1, 4096),
        64,
        "signed HELLOs of nodes that are not peers, learned by peer exchange, kept to replace peers that leave",
    )
    ping_interval_s: float = option(
        Number(0.05, 3600), 1.0, "PING each peer this often; PONG gives the round-trip time"
    )
    peer_timeout_s: float = option(
        Number(0.2, 86400), 5.0, "a peer silent this long is evicted; must exceed 2 × ping_interval_s"
    )
    exchange_interval_s: float = option(
        Number(0.05, 3600), 2.0, "send PEERS (peer exchange) to `gossip_fanout` random peers this often"
    )
    gossip_fanout: int = option(Integer(1, 64), 2, "peers that get each periodic PEERS")
    hello_refresh_s: float = option(
        Number(1, 86400), 300.0, "re-sign this node's HELLO this often, so relayed copies stay fresh"
    )
    hello_max_age_s: float = option(
        Number(2, 86400 * 7), 900.0, "ignore relayed HELLOs older than this; must exceed hello_refresh_s"
    )
    dial_retry_initial_s: float = option(
        Number(0.01, 60), 0.05, "first retry of an unanswered HELLO; doubles per attempt"
    )
    dial_retry_max_s: float = option(Number(0.1, 3600), 5.0, "longest wait between HELLO retries")
    dial_attempts: int = option(
        Integer(1, 10_000),
        8,
        "give up verifying an address learned from a HELLO after this many unanswered "
        "challenges (bootstrap addresses are retried forever)",
    )
    max_dialing: int = option(
        Integer(1, 4096), 16, "addresses being verified at once (bootstrap addresses not counted)"
    )
    dialing_per_informant: int = option(
        Integer(1, 4096), 4, "addresses relayed by one peer that are being verified at once"
    )
    dialing_per_subnet: int = option(Integer(1, 4096), 4, "addresses in one subnet (/24 or /64) being verified at once")
    settled_after_s: float = option(
        Number(0, 86400 * 7),
        300.0,
        "a peer admitted this long ago is never displaced for a newcomer: neither from a full table "
        "by a newcomer from a less crowded subnet, nor, with a bounded view, for a newcomer that comes "
        "back after a redirect (the slack that lets the last nodes in: docs/daemon.md); 0: none ever is",
    )
    reachability_confirmations: int = option(
        Integer(1, 64),
        2,
        "peers whose challenge must have reached this node at its advertised address before `status` "
        'calls it `public` (docs/daemon.md, "Reachability")',
    )
    dial_back_after_s: float = option(
        Number(0, 86400),
        5.0,
        "while not known to be reachable at its advertised address, a node asks its bootstrap entries "
        "and peers to dial it back (DIAL_ME, docs/protocol.md) this long after it starts, then every "
        'dial_back_interval_s (docs/daemon.md, "Reachability")',
    )
    dial_back_interval_s: float = option(
        Number(1, 86400),
        60.0,
        "how often a node asks for dial-backs, and dials back one host at most (what it asks for: its "
        "own host, at a port it names)",
    )
    max_dial_backs: int = option(
        Integer(0, 4096), 16, "dial-backs a node gives in all per dial_back_interval_s, to any hosts; 0: none"
    )
    max_peers_per_subnet: int = option(
        Integer(1, 4096), 16, "peers admitted from one subnet (/24 for IPv4, /64 for IPv6)"
    )
    subnet_limits_exempt: tuple[str, ...] = option(
        ListOf(Network(), 256),
        ("127.0.0.0/8", "::1/128"),
        "networks the two subnet limits do not apply to (loopback: every node there is this host)",
    )

    def check(self, context: CheckContext) -> list[str]:
        problems = []
        if self.peer_timeout_s <= 2 * self.ping_interval_s:
            problems.append(
                "[discovery].peer_timeout_s: must exceed 2 × ping_interval_s "
                f"({2 * self.ping_interval_s:g}), got {self.peer_timeout_s:g}"
            )
        if self.hello_max_age_s <= self.hello_refresh_s:
            problems.append(
                "[discovery].hello_max_age_s: must exceed hello_refresh_s "
                f"({self.hello_refresh_s:g}), got {self.hello_max_age_s:g}"
            )
        if self.dial_retry_max_s < self.dial_retry_initial_s:
            problems.append("[discovery].dial_retry_max_s: must not be below dial_retry_initial_s")
        for index, (_, key) in enumerate(self.bootstrap_peers(), start=1):
            if key is None:
                continue  # whether it needs one: config/checks.py, with [security].curve
            try:  # CURVE's server key, to dial the peer, is derived from its Ed25519 key
                curve_public_from_ed25519(key)
            except ValueError as exc:
                problems.append(f"[discovery].bootstrap: entry {index}: {exc}")
        return problems

    def bootstrap_peers(self) -> tuple[tuple[str, bytes | None], ...]:
        """Each bootstrap entry's address, and its peer's Ed25519 key where the entry names one."""
        return tuple(split_bootstrap(entry) for entry in self.bootstrap)


@dataclass(frozen=True, kw_only=True)
class BeaconSettings(Section):
    enabled: bool = option(
        Flag(), False, "announce and discover nodes on the LAN by UDP multicast (for nodes without bootstrap peers)"
    )
    group: str = option(Text(what="an IPv4 multicast address"), "239.255.70.70", "multicast group")
    port: int = option(Integer(1, 65535), 47474, "UDP port of the beacon")
    interface: str = option(
        Text(what="an IPv4 address"), "0.0.0.0", "local interface address for multicast (0.0.0.0: the system's choice)"
    )
    interval_s: float = option(Number(0.1, 3600), 5.0, "send a beacon this often")
    ttl: int = option(Integer(0, 255), 1, "multicast TTL; 1 keeps beacons on the local network")

    def check(self, context: CheckContext) -> list[str]:
        problems = []
        try:
            if not ipaddress.IPv4Address(self.group).is_multicast:
                problems.append(f"[beacon].group: {self.group} is not a multicast address (224.0.0.0/4)")
        except ValueError:
            problems.append(f"[beacon].group: {self.group!r} is not an IPv4 address")
        try:
            ipaddress.IPv4Address(self.interface)
        except ValueError:
            problems.append(f"[beacon].interface: {self.interface!r} is not an IPv4 address")
        return problems
