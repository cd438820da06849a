"""Who may hold a connection to this node: ZeroMQ's ZAP hook, and the live connection counts it
decides on.

libzmq asks a ZAP handler (a REP socket at `inproc://zeromq.zap.01` in the socket's context)
about every inbound connection during its handshake, once the ROUTER has a ZAP domain: with
CURVE, after the client proved it holds the secret of its public key; without CURVE too (the
NULL mechanism), so the connection caps hold either way. The handler answers within the
handshake, before any frame of the connection is read:

- with CURVE and `[security].allowlist`: a client key that is not the transport key of a listed
  node is refused (`zap_denied_allowlist`);
- more live connections from the source address than `max_connections_per_address`, from its
  prefix (/24, /64) than `max_connections_per_prefix`, or in all than `max_connections`, are
  refused (`zap_denied_address_cap`, `zap_denied_prefix_cap`, `zap_denied_total_cap`), except,
  with CURVE, a client that is an admitted peer: a stranger holding connections cannot shut
  peers out, nor, from one network, newcomers from others;
- on the peers' socket (domain `p2pnode-peers`), with CURVE, only admitted peers
  (`zap_denied_not_peer`): strangers cannot send it the large frames that socket takes, nor
  reach the process that holds it (inbound/supervisor.py);
- an accepted CURVE connection gets the client's X25519 key (hex) as its User-Id, which ZeroMQ
  attaches to every frame it carries: the gate (gate.py) binds frames to it.

The start-up race: when nodes start together, one admits another a moment before the other
admits it, and its first connection to the other's peers' socket is refused
(`zap_denied_not_peer`, and so `handshake_failed`) until it dials again. Such a refusal whose key
this node admits within `not_peer_race_s` after it is counted once more, in
`not_peer_race_resolved`, which `p2pnode status` shows apart (`NotPeerRefusals`).

Who aborted an inbound socket's process (inbound/supervisor.py): the connections reset by their other end
(inbound/resets.py) within `abort_suspect_s` before the abort, and nobody else. Each such source
address gets a strike, and with CURVE so does the key that connected from that address to that
process, if only one did (an address several keys connected from names none of them); where
that key is an admitted peer's, it is struck instead of the address (a host, or a NAT, may be
others' too). `abort_strikes` strikes within `abort_ban_s` ban an address or key for
`abort_ban_s`, an admitted peer's key too, whatever its timing. A source prefix (/24, /64) with `abort_strikes`
traced aborts is throttled meanwhile: one stranger's connection from it per
`abort_prefix_interval_s`, so an attacker with many addresses gets a bounded share. An abort
traced to no reset bans nobody (`abort_untraced`).

Live connections are counted from the ROUTER's monitor events: ACCEPTED and DISCONNECTED carry
the connection's file descriptor, whose remote address is read when it is accepted. libzmq
sends a connection's ACCEPTED before its ZAP request, and the handler reads every pending event
before it decides, so a connection is counted before it is judged. libzmq never drops a monitor
event (its I/O thread waits while the monitor's queue, `MONITOR_QUEUE`, is full), so the counts
stay exact. Every event and decision is counted in `Metrics.connections`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable

import zmq

from protocol.curve import curve_public_from_ed25519

from ..wire.settings import SecuritySettings
from .gate import subnet_of
from .zmqsetup import DOMAINS, FAILED_EVENTS, PEERS, PEERS_DOMAIN, PUBLIC, ZAP_DOMAIN

# The latest resets and CURVE connections allowed, kept to trace an abort (a few seconds' worth
# under any attack that leaves the node up).
RESETS_KEPT = 4096
KEYS_KEPT = 4096

__all__ = [
    "Connections",
    "NotPeerRefusals",
    "PeerTransportKeys",
    "ZAP_DOMAIN",
    "PEERS_DOMAIN",
    "PUBLIC",
    "PEERS",
    "DOMAINS",
]


class PeerTransportKeys:
    """With CURVE, the transport keys of the admitted peers: they pass the connection caps and
    may hold a connection to the peers' socket (`Connections.is_peer`)."""

    def __init__(self, curve: bool) -> None:
        self.curve = curve
        self.keys: set[bytes] = set()
        # Told each transport key admitted: `Connections.peer_admitted` (the start-up race).
        self.on_admitted: Callable[[bytes], None] | None = None

    def __contains__(self, transport_key: bytes) -> bool:
        return transport_key in self.keys

    def track(self, key: bytes, *, admitted: bool) -> None:
        """Membership admitted the peer of Ed25519 `key`, or evicted it."""
        if not self.curve:
            return
        try:
            transport_key = curve_public_from_ed25519(key)
        except ValueError:
            return  # no transport key: it cannot connect over CURVE anyway
        if admitted:
            self.keys.add(transport_key)
            if self.on_admitted is not None:
                self.on_admitted(transport_key)
        else:
            self.keys.discard(transport_key)


class NotPeerRefusals:
    """The `zap_denied_not_peer` refusals of the last `not_peer_race_s`, by key: (when the first
    of them was, how many). A key that membership then admits within `not_peer_race_s` of that
    first one resolves them: they were the start-up race, counted in `not_peer_race_resolved`.
    Older refusals stay refusals (a key refused again later starts anew). At most
    `not_peer_race_keys` keys are remembered, the oldest forgotten first (their refusals stay
    refusals too): a stranger with many keys costs that bound and no more."""

    def __init__(self, settings: SecuritySettings, counts: Counter[str]) -> None:
        self.window_s, self.max_keys, self.counts = settings.not_peer_race_s, settings.not_peer_race_keys, counts
        self.pending: dict[bytes, tuple[float, int]] = {}  # key -> (first refusal, refusals); oldest first

    def refused(self, key: bytes, now: float) -> None:
        """A connection of `key` to the peers' socket was refused at `now` (`zap_denied_not_peer`)."""
        self._expire(now)
        if not self.window_s:
            return
        first, count = self.pending.get(key, (now, 0))
        if not count:
            while len(self.pending) >= self.max_keys:
                del self.pending[next(iter(self.pending))]  # the oldest: its refusals stay refusals
        self.pending[key] = (first, count + 1)  # an update keeps its place: the dict stays oldest first

    def admitted(self, key: bytes, now: float) -> None:
        """`key` (a transport key) was admitted as a peer at `now`: its refusals of the last
        `not_peer_race_s` were the start-up race."""
        self._expire(now)
        _, count = self.pending.pop(key, (now, 0))
        if count:
            self.counts["not_peer_race_resolved"] += count

    def _expire(self, now: float) -> None:
        while self.pending:
            key = next(iter(self.pending))
            if now - self.pending[key][0] <= self.window_s:
                break
            del self.pending[key]


class Connections:
    """Live inbound connections by source address, and the verdict on each new one."""

    def __init__(
        self,
        settings: SecuritySettings,
        counts: Counter[str],
        is_peer: Callable[[bytes], bool],
    ) -> None:
        """`is_peer(x25519 key)`: whether the key is the transport key of an admitted peer;"""
        self.settings, self.counts, self.is_peer = settings, counts, is_peer
        self.allowed: frozenset[bytes] | None = None
        if settings.curve and settings.allowlist is not None:
            self.allowed = frozenset(_curve_keys(settings.allowlist))
        # (inbound socket, descriptor) -> the source address of a live connection
        self.by_fd: dict[tuple[str, int], str] = {}
        self.by_address: Counter[str] = Counter()
        self.by_prefix: Counter[str] = Counter()
        # Suspects of aborts: source addresses, and (with CURVE) client keys, which is how an
        # admitted peer is told from others on one host. -> (aborts in a row, the last one's time)
        self.strikes: dict[str | bytes, tuple[int, float]] = {}
        self.banned: dict[str | bytes, float] = {}  # address or key -> refused until then
        self.resets: deque[tuple[float, str, str]] = deque(maxlen=RESETS_KEPT)  # (when, socket, address)
        # (when, socket, address, key) of each CURVE connection allowed
        self.keys_allowed: deque[tuple[float, str, str, bytes]] = deque(maxlen=KEYS_KEPT)
        self.started: dict[str, float] = {}  # socket -> when its ingress process came up
        self.prefix_strikes: dict[str, tuple[int, float]] = {}  # source prefix -> traced aborts, the last's time
        self.throttled: dict[str, float] = {}  # source prefix -> throttled until then
        self.prefix_taken: dict[str, float] = {}  # throttled prefix -> when a stranger last got in from it
        self.not_peer = NotPeerRefusals(settings, counts)  # the start-up race, told from refusals

    def peer_admitted(self, transport_key: bytes, now: float) -> None:
        """Membership admitted the peer of `transport_key` at `now` (`PeerTransportKeys`): its
        connections refused as not a peer's within `not_peer_race_s` were the start-up race."""
        self.not_peer.admitted(transport_key, now)

    def on_event(self, event: int, fd: int, address: str | None, socket: str = PUBLIC, now: float = 0.0) -> None:
        """One monitor event of an inbound socket at `now`; `address`: the source address of an
        accepted connection ("?" if unknown), looked up where the descriptor lives
        (inbound/process.py)."""
        if event == zmq.EVENT_ACCEPTED:
            address = address or "?"
            self.by_fd[socket, fd] = address
            self.by_address[address] += 1
            self.by_prefix[subnet_of(address)] += 1
            self.counts["accepted"] += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self.counts["disconnected"] += 1
            address = self.by_fd.pop((socket, fd), None)
            if address is not None:
                self._gone(address)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.counts["handshake_succeeded"] += 1
        elif event in FAILED_EVENTS:
            self.counts["handshake_failed"] += 1

    def socket_up(self, socket: str, now: float) -> None:
        """An ingress process took `socket` at `now`: the keys allowed from then on are the ones
        an abort of this process can be traced to."""
        self.started[socket] = now

    def reset(self, socket: str, address: str, now: float) -> None:
        """A connection to `socket` from `address` was reset by its other end at `now`
        (inbound/resets.py): the one kind of connection that can abort libzmq."""
        self.resets.append((now, socket, address))
        self.counts["reset"] += 1

    def forget_all(self, socket: str, now: float, aborted: bool) -> list[str]:
        """Every connection to one inbound socket is gone at once: the ingress process that held
        them ended at `now`. If libzmq `aborted` it, the connections reset within
        `abort_suspect_s` before caused it (the module's docstring): their addresses, and the
        keys those addresses alone connected with, get a strike, those at `abort_strikes` are
        banned for `abort_ban_s`, and their prefixes may be throttled. Returns what was banned
        now (addresses; keys as `key:HEX`)."""
        for key in [key for key in self.by_fd if key[0] == socket]:
            self._gone(self.by_fd.pop(key))
        if not aborted or not self.settings.abort_ban_s:
            return []
        # Resets to this process (not to the one before, whose abort they were) and lately.
        since = self.started.get(socket, -math.inf)
        recent = max(since, now - self.settings.abort_suspect_s)
        culprits = {address for when, on, address in self.resets if on == socket and when > recent and address != "?"}
        if not culprits:
            self.counts["abort_untraced"] += 1
            return []
        self.counts["abort_traced"] += 1
        suspects: set[str | bytes] = set()
        for address in culprits:
            keys = {key for when, on, at, key in self.keys_allowed if on == socket and at == address and when >= since}
            if len(keys) > 1:
                self.counts["abort_key_untold"] += 1  # several keys connected from that address
            key = next(iter(keys)) if len(keys) == 1 else None
            # An admitted peer's key, where it is told: not its host, which may be others' too.
            suspects |= {key} if key is not None and self.is_peer(key) else {address, key} - {None}
            self._strike_prefix(subnet_of(address), now)
        banned = []
        for suspect in suspects:
            if self._strike(self.strikes, suspect, now) >= self.settings.abort_strikes:
                self.banned[suspect] = now + self.settings.abort_ban_s
                self.counts["abort_banned"] += 1
                banned.append(suspect if isinstance(suspect, str) else f"key:{suspect.hex()}")
        self._expire(now)
        return sorted(banned)

    def _gone(self, address: str) -> None:
        for counter, name in ((self.by_address, address), (self.by_prefix, subnet_of(address))):
            counter[name] -= 1
            if not counter[name]:
                del counter[name]

    def _strike(self, strikes: dict, suspect: str | bytes, now: float) -> int:
        """One more strike for `suspect` at `now` (counting again after `abort_ban_s` without);
        how many it has."""
        count, last = strikes.get(suspect, (0, -math.inf))
        count = count + 1 if now - last <= self.settings.abort_ban_s else 1
        strikes[suspect] = (count, now)
        return count

    def _strike_prefix(self, prefix: str, now: float) -> None:
        if self._strike(self.prefix_strikes, prefix, now) >= self.settings.abort_strikes:
            if prefix not in self.throttled:
                self.counts["abort_prefix_throttled"] += 1
            self.throttled[prefix] = now + self.settings.abort_ban_s

    def _banned(self, suspect: str | bytes, now: float) -> bool:
        until = self.banned.get(suspect)
        if until is not None and until <= now:
            del self.banned[suspect]  # over
        return until is not None and until > now

    def _expire(self, now: float) -> None:
        """Bans, throttles and strikes past their time are dropped: they stay as small as the
        attackers."""
        self.banned = {address: until for address, until in self.banned.items() if until > now}
        self.throttled = {prefix: until for prefix, until in self.throttled.items() if until > now}
        self.prefix_taken = {prefix: at for prefix, at in self.prefix_taken.items() if prefix in self.throttled}
        window = self.settings.abort_ban_s
        for strikes in (self.strikes, self.prefix_strikes):
            for suspect in [suspect for suspect, (_, last) in strikes.items() if now - last > window]:
                del strikes[suspect]

    def decide(
        self, address: str, mechanism: bytes, credentials: list[bytes], domain: bytes = ZAP_DOMAIN, now: float = 0.0
    ) -> str | None:
        """The refusal of a connection from `address` (already counted), or None to accept it."""
        key = credentials[0] if mechanism == b"CURVE" and credentials else None
        if key is not None and self.allowed is not None and key not in self.allowed:
            return "zap_denied_allowlist"
        if key is not None and self._banned(key, now):
            return "zap_denied_aborts"  # an admitted peer's key too: it aborted this node's sockets
        if key is not None and self.is_peer(key):
            return None  # an admitted peer is never shut out by others' connections
        if self._banned(address, now):
            return "zap_denied_aborts"
        if self._throttled(subnet_of(address), now):
            return "zap_denied_prefix_throttled"
        if key is not None and domain == PEERS_DOMAIN:
            # Strangers handshake on the public socket; keys being verified too: the peers'
            # socket's process is then reachable by admitted keys alone (inbound/supervisor.py). A key that
            # admits this node first and dials here is refused until this node admits it, and
            # dials again (transport.py `_revive_peers`); meanwhile its frames go to the public
            # socket.
            return "zap_denied_not_peer"
        if self.by_address[address] > self.settings.max_connections_per_address:
            return "zap_denied_address_cap"
        s = self.settings
        if self.by_prefix[subnet_of(address)] > max(s.max_connections_per_prefix, s.max_connections_per_address):
            return "zap_denied_prefix_cap"
        if len(self.by_fd) > self.settings.max_connections:
            return "zap_denied_total_cap"
        return None

    def _throttled(self, prefix: str, now: float) -> bool:
        """A stranger from a throttled prefix gets in once per `abort_prefix_interval_s`."""
        until = self.throttled.get(prefix)
        if until is None or until <= now:
            return False
        return now - self.prefix_taken.get(prefix, -math.inf) < self.settings.abort_prefix_interval_s

    def reply(self, request: list[bytes], now: float = 0.0) -> list[bytes]:
        """The ZAP reply (RFC 27) to one request at `now`: version, id, status, text, user id, metadata."""
        if len(request) < 6 or request[0] != b"1.0":
            self.counts["zap_malformed"] += 1
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed request", b"", b""]
        address, mechanism, credentials = request[3].decode(errors="replace"), request[5], request[6:]
        refusal = self.decide(address, mechanism, credentials, request[2], now)
        if refusal is not None:
            self.counts[refusal] += 1
            if refusal == "zap_denied_not_peer":
                self.not_peer.refused(credentials[0], now)
            return [b"1.0", request[1], b"400", refusal.encode(), b"", b""]
        self.counts["zap_allowed"] += 1
        prefix = subnet_of(address)
        if prefix in self.throttled:
            self.prefix_taken[prefix] = now
        if mechanism == b"CURVE" and credentials:
            self.keys_allowed.append((now, _SOCKETS.get(request[2], PUBLIC), address, credentials[0]))
        user_id = credentials[0].hex().encode() if mechanism == b"CURVE" and credentials else b""
        return [b"1.0", request[1], b"200", b"OK", user_id, b""]


_SOCKETS = {domain: socket for socket, domain in DOMAINS.items()}


def _curve_keys(keys) -> list[bytes]:
    derived = []
    for key in keys:
        try:
            derived.append(curve_public_from_ed25519(key))
        except ValueError:
            pass  # a listed key with no transport key can never connect
    return derived
