"""`p2pnode doctor`: why a running node does or does not reach its peers, and what to change.

It reads the node's `status` (nothing more: no probe of its own) and says, line by line: what
kind of address the node advertises, whether it is reachable (`reachability`), and for each
bootstrap entry whether it became a peer and, if not, what its connection's handshakes tell
(docs/deploy.md, "Behind a NAT or a firewall").
"""

from __future__ import annotations

import ipaddress

from protocol.messages import is_client_address

from ..discovery.subnets import host_of

PURE = True  # no I/O and no clock (tests/test_layering.py checks)

__all__ = ["diagnose"]

CARRIER_NAT = ipaddress.ip_network("100.64.0.0/10")  # RFC 6598: a carrier's NAT, never reachable from outside
# Addresses a home or office network hands out (RFC 1918, unique local, link-local): routed
# nowhere else. (Python's `is_private` also counts the documentation ranges, which a testbed uses.)
LOCAL_NETWORKS = tuple(
    ipaddress.ip_network(cidr)
    for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "fc00::/7", "fe80::/10")
)


def diagnose(status: dict) -> tuple[list[str], int]:
    """The lines `doctor` prints for `status`, and how many problems they name."""
    lines, problems = [], 0
    address_line, address_problem = _address(status["address"])
    lines.append(address_line)
    problems += address_problem
    reachability = status.get("reachability")
    if reachability is not None:
        lines.append(f"reachability: {reachability['state']} ({reachability['why']})")
        problems += reachability["state"] == "private"
    relay = relay_line(status)
    if relay:
        lines.append(relay)
    lines += _relayed_peers(status)
    for entry in status.get("bootstraps", []):
        line, problem = _bootstrap(entry, status["address"])
        lines.append(line)
        problems += problem
    if not status.get("bootstraps") and not status["peer_count"]:
        lines.append("no bootstrap entries and no peers: this node waits for others to dial it ([discovery].bootstrap)")
    lines.append(f"peers: {status['peer_count']}/{status['max_peers']}")
    lines.append("no problem found" if not problems else f"{problems} problem{'s' if problems > 1 else ''} found")
    return lines, problems


def _address(address: str) -> tuple[str, int]:
    said = f"advertises {address}"
    if is_client_address(address):
        return (
            f"{said}: client mode, reached over the connections it dials; the nodes it can dial (public ones) "
            "are its peers, other client nodes are reached through relays ([relay].enabled on a public node)",
            0,
        )
    host = host_of(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"{said}: a host name, reachable wherever it resolves to this host", 0
    if ip.is_loopback:  # fine for a rehearsal on one machine, and no problem there
        return f"{said}: loopback, reachable from this host only (other hosts: [node].listen / advertise)", 0
    if ip in CARRIER_NAT:
        return f"{said}: behind a carrier's NAT (100.64.0.0/10), reachable from nowhere outside it", 1
    if any(ip in network for network in LOCAL_NETWORKS):
        return f"{said}: a private address, reachable from its own network only (peers elsewhere: NAT)", 0
    return f"{said}: a public address", 0


def _bootstrap(entry: dict, address: str) -> tuple[str, int]:
    """One bootstrap entry: a peer, or what its dial's handshakes say is in the way."""
    said = f"bootstrap entry {entry['entry']} ({entry['address']}): "
    if entry["admitted"]:
        return said + "a peer", 0
    handshakes = entry["handshakes"]
    if handshakes.get("succeeded"):
        return said + (
            f"takes this node's connection but its answers never arrive: it cannot reach {address}. "
            "Give this node a public address, or forward its two ports on the router and set "
            '[node].advertise to the router\'s public address (docs/deploy.md, "Behind a NAT or a firewall")'
        ), 1
    if handshakes.get("failed"):
        return said + (
            "the node there has another key, or CURVE off: compare the entry's key with that node's "
            "`p2pnode keyinfo`, and [security].curve on both"
        ), 1
    if handshakes.get("refused"):
        return said + "the node there refuses this node (its [security].allowlist or connection caps)", 1
    return said + (
        "no connection yet: nothing listens there, or a firewall on its side drops it "
        "(still retrying; check the address and that the node runs)"
    ), 1


def relay_line(status: dict) -> str:
    """What the node holds of relays: the places it keeps for client nodes, or, on a client node,
    its places at relays; "" where neither (or an older node, which does not say)."""
    relay = status.get("relay")
    if relay is None:
        return ""
    if relay["enabled"]:
        holders = relay["holders"]
        return f"relay: holds places for {len(holders)} client node{'s' * (len(holders) != 1)}"
    if not status.get("client_mode"):
        return ""
    held = ", ".join(f"{r['node_id']} (expires in {r['expires_in_s']:.0f} s)" for r in relay["relays"])
    return f"relays: {held}" if held else "relays: none held (no peer announces `relay`: [relay].enabled)"


def _relayed_peers(status: dict) -> list[str]:
    """A line for each peer reached through a relay: why, and what would reach it directly."""
    lines = []
    for peer in status.get("peers", []):
        route = peer.get("route") or ""
        if route.startswith("relay:"):
            lines.append(
                f"peer {peer['node_id']}: through relay {route.removeprefix('relay:')}, sealed end to end: neither "
                "this node nor it can be dialled (a forwarded port and [node].advertise on either one makes it direct)"
                if status.get("client_mode")
                else f"peer {peer['node_id']}: through relay {route.removeprefix('relay:')} until it dials this node "
                "(connection reversal asked; if it never does, a firewall on its side drops outbound connections here)"
            )
    return lines
