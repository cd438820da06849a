"""Who this node's peers are: admission, peer exchange, liveness, eviction, dialing with backoff.

`Membership` is a state machine with no I/O: the node feeds it verified messages and the time,
and carries out the actions it returns (dial, hang up, send). That keeps every discovery rule
testable without sockets.

The handshake: a node that wants to join sends HELLO to an address (dialing, retried with
exponential backoff). The receiver admits the sender and answers with PEERS whose first entry
is its own signed HELLO; the dialer admits it from that entry. PEERS never asks for an answer,
so no exchange can loop. Every signed HELLO a node learns (directly, relayed in PEERS, or by LAN
beacon) names an address to dial next, until the table holds every peer (or `max_peers`).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from protocol import (
    MAX_RELAYED_HELLOS,
    PROTOCOL_VERSION,
    Body,
    Bye,
    Envelope,
    Hello,
    MessageType,
    Peers,
    Ping,
    Pong,
    node_id,
)

from .config import DiscoverySettings
from .metrics import UNKNOWN_PEER

__all__ = ["Peer", "Membership", "Dial", "Hangup", "SendHello", "Send", "Action"]


_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Dial:
    """Open (if not open yet) the outbound connection to `address`."""

    address: str


@dataclass(frozen=True)
class Hangup:
    """Close the outbound connection to `address`."""

    address: str


@dataclass(frozen=True)
class SendHello:
    """Send a freshly signed HELLO to `address`, then report back with `hello_sent`."""

    address: str


@dataclass(frozen=True)
class Send:
    """Sign `body` once and send the frame to every address."""

    addresses: tuple[str, ...]
    body: Body


Action = Dial | Hangup | SendHello | Send


@dataclass
class Peer:
    key: bytes
    address: str
    capabilities: tuple[str, ...]
    dataset_size: int
    hello: bytes  # its latest signed HELLO frame, relayed verbatim in PEERS
    hello_timestamp_us: int
    admitted_at: float
    last_seen: float
    rtt_s: float | None = None
    last_answer_at: float = float("-inf")
    answer_at: float | None = None  # a PEERS owed to it, once its connection is up
    admitted_us: bool = False  # it knows us: it answered our HELLO, or our answer to its HELLO went out

    @property
    def node_id(self) -> str:
        return node_id(self.key)


@dataclass
class _Dialing:
    address: str
    permanent: bool  # a bootstrap address: retried forever
    key: bytes | None  # the key expected there, when learned from a signed HELLO
    next_at: float
    delay: float
    hello_timestamp_us: int = 0  # of the signed HELLO that named this address, if any
    attempts: int = 0
    opened: bool = False  # the outbound connection has been asked for


class Membership:
    def __init__(self, own_key: bytes, settings: DiscoverySettings, *, rng: random.Random, now: float) -> None:
        self.own_key = own_key
        self.settings = settings
        self.rng = rng
        self.peers: dict[bytes, Peer] = {}
        self.dialing: dict[str, _Dialing] = {}
        self.own_hello: bytes | None = None
        # Key -> timestamp of the HELLO we gave up dialling: only a newer one is worth a new try.
        self._given_up: dict[bytes, int] = {}
        self.counts: Counter[str] = Counter()  # admitted, evicted, refused_full, gave_up, ...
        self._ping_nonce: int | None = None
        self._ping_sent_at = 0.0
        self._next_ping_at = now
        self._next_gossip_at = now + settings.exchange_interval_s
        for address in settings.bootstrap:
            self._dial_later(address, permanent=True, key=None, now=now)

    # --- what the node tells us ----------------------------------------------------------

    def set_own_hello(self, frame: bytes) -> None:
        """This node's latest signed HELLO, put first in every PEERS it sends."""
        self.own_hello = frame

    def on_message(
        self, envelope: Envelope, frame: bytes, now: float, now_us: int, relayed: list[tuple[Envelope, bytes]] = ()
    ) -> tuple[list[Action], str | None]:
        """A verified discovery message (DISCOVERY_TYPES); `relayed` holds a PEERS' entries,
        already verified. Returns the actions, and the reason it is refused, if it is."""
        is_peer = self.on_frame(envelope.sender, now)
        kind, body = envelope.type, envelope.body
        if kind is MessageType.HELLO:
            return self.on_hello(envelope, frame, now), None
        if kind is MessageType.PEERS:
            return self.on_peers(envelope, list(relayed), now, now_us), None
        if not is_peer:
            return [], UNKNOWN_PEER  # PING, PONG and BYE mean something only from a peer
        if kind is MessageType.PING:
            return self.on_ping(envelope.sender, body), None
        if kind is MessageType.PONG:
            self.on_pong(envelope.sender, body, now)
            return [], None
        return self.on_bye(envelope.sender, now), None

    def on_hello(self, envelope: Envelope, frame: bytes, now: float) -> list[Action]:
        """A HELLO received directly: its sender is dialing us. Admit it, answer with PEERS."""
        key = envelope.sender
        if key == self.own_key:
            self._forget_dialing(envelope.body.address)  # we dialled ourselves (our own bootstrap)
            return [Hangup(envelope.body.address)]
        known = key in self.peers
        peer = self._admit_or_update(envelope, frame, now)
        if peer is None or now - peer.last_answer_at < self.settings.dial_retry_initial_s:
            return []  # refused, or answered a moment ago (bounds what repeated HELLOs cost us)
        peer.last_answer_at = now
        if not known:
            return self._answer_soon(peer, now)
        peer.admitted_us = True  # our answer goes out now, ahead of anything we send it later
        return [Send((peer.address,), self._peers_body())]

    def on_peers(
        self, envelope: Envelope, relayed: list[tuple[Envelope, bytes]], now: float, now_us: int
    ) -> list[Action]:
        """PEERS from `envelope.sender`; `relayed` holds its HELLO entries, already verified."""
        actions: list[Action] = []
        for hello, frame in relayed:
            if hello.sender == envelope.sender:
                # The sender's own HELLO: it is alive and answering, so it is admitted at once.
                known = hello.sender in self.peers
                peer = self._admit_or_update(hello, frame, now)
                if peer is not None:
                    peer.admitted_us = True  # it answers only a HELLO it accepted
                if peer is not None and not known:
                    actions += self._answer_soon(peer, now)
            else:
                actions += self.on_announced(hello, frame, now, now_us)
        return actions

    def on_announced(self, hello: Envelope, frame: bytes, now: float, now_us: int) -> list[Action]:
        """A signed HELLO heard second hand (relayed in PEERS, or a LAN beacon): maybe dial it."""
        key, address = hello.sender, hello.body.address
        if key == self.own_key:
            return []
        if abs(now_us - hello.timestamp_us) > self.settings.hello_max_age_s * 1e6:
            self.counts["stale_hello"] += 1
            return []
        peer = self.peers.get(key)
        if peer is not None:
            if hello.timestamp_us > peer.hello_timestamp_us:
                peer.hello, peer.hello_timestamp_us = frame, hello.timestamp_us
            return []
        if address in self.dialing or not self._has_room(candidates=True):
            return []
        if hello.timestamp_us <= self._given_up.get(key, -1):
            return []
        if PROTOCOL_VERSION not in hello.body.protocol_versions:
            return []
        self._dial_later(address, permanent=False, key=key, now=now, hello_timestamp_us=hello.timestamp_us)
        return self._dial_now(self.dialing[address], now)  # opens the connection; HELLO follows

    def hello_sent(self, address: str, ok: bool, now: float) -> list[Action]:
        """Outcome of a SendHello: schedule the next try, or give up on a learned address."""
        entry = self.dialing.get(address)
        if entry is None:
            return []
        if not ok:
            self.counts["hello_not_sent"] += 1
        if not entry.permanent and entry.attempts >= self.settings.dial_attempts:
            del self.dialing[address]
            self.counts["gave_up"] += 1
            if entry.key is not None:
                if len(self._given_up) >= 4 * self.settings.max_peers:
                    self._given_up.clear()  # bounded; forgetting only costs a few more HELLOs
                self._given_up[entry.key] = entry.hello_timestamp_us
            return [] if self._in_use(address) else [Hangup(address)]
        return []

    def ready(self) -> list[Peer]:
        """The peers that have admitted this node too, or will before anything else we send
        them arrives (our PEERS answer went out first on that connection). Only these are
        pinged and sent learning payloads: the others would refuse them as from an unknown peer."""
        return [peer for peer in self.peers.values() if peer.admitted_us]

    def on_frame(self, key: bytes, now: float) -> bool:
        """Any verified frame from `key`; True if it is a peer."""
        peer = self.peers.get(key)
        if peer is None:
            return False
        peer.last_seen = now
        return True

    def on_ping(self, key: bytes, ping: Ping) -> list[Action]:
        peer = self.peers.get(key)
        return [Send((peer.address,), Pong(nonce=ping.nonce))] if peer else []

    def on_pong(self, key: bytes, pong: Pong, now: float) -> None:
        peer = self.peers.get(key)
        if peer is not None and pong.nonce == self._ping_nonce:
            peer.rtt_s = now - self._ping_sent_at

    def on_bye(self, key: bytes, now: float) -> list[Action]:
        peer = self.peers.get(key)
        return self._evict(peer, now, "bye") if peer else []

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: evict the silent, ping the rest, retry dials, gossip peers."""
        actions: list[Action] = []
        for peer in list(self.peers.values()):
            if now - peer.last_seen > self.settings.peer_timeout_s:
                actions += self._evict(peer, now, "timeout")
        owed = [peer for peer in self.peers.values() if peer.answer_at is not None and now >= peer.answer_at]
        if owed:
            for peer in owed:
                peer.answer_at = None
                peer.admitted_us = True  # our answer, sent now, admits us there before anything else
            actions.append(Send(self._addresses(owed), self._peers_body()))
        ready = self.ready()
        if now >= self._next_ping_at and ready:
            # One nonce per round: one signed PING serves every peer, and each PONG times one.
            self._ping_nonce = self.rng.randint(0, _U64)
            self._ping_sent_at = now
            actions.append(Send(self._addresses(ready), Ping(nonce=self._ping_nonce)))
        if now >= self._next_ping_at:
            self._next_ping_at = now + self.settings.ping_interval_s
        for entry in list(self.dialing.values()):
            if now >= entry.next_at:
                actions += self._dial_now(entry, now)
        if now >= self._next_gossip_at:
            self._next_gossip_at = now + self.settings.exchange_interval_s
            if ready:
                chosen = self.rng.sample(ready, min(self.settings.gossip_fanout, len(ready)))
                actions.append(Send(self._addresses(chosen), self._peers_body()))
        return actions

    def goodbye(self) -> list[Action]:
        """What to send on shutdown."""
        return [Send(self._addresses(self.peers.values()), Bye(reason="shutdown"))] if self.peers else []

    def snapshot(self, now: float) -> list[dict]:
        return [
            {
                "node_id": peer.node_id,
                "public_key": peer.key.hex(),
                "address": peer.address,
                "last_seen_s": round(now - peer.last_seen, 3),
                "rtt_ms": None if peer.rtt_s is None else round(peer.rtt_s * 1e3, 3),
                "capabilities": list(peer.capabilities),
                "dataset_size": peer.dataset_size,
                "connected_s": round(now - peer.admitted_at, 3),
            }
            for peer in sorted(self.peers.values(), key=lambda p: p.node_id)
        ]

    # --- internals -----------------------------------------------------------------------

    def _admit_or_update(self, hello: Envelope, frame: bytes, now: float) -> Peer | None:
        body: Hello = hello.body
        key = hello.sender
        peer = self.peers.get(key)
        if peer is not None:
            peer.last_seen = now
            if hello.timestamp_us >= peer.hello_timestamp_us:
                if body.address != peer.address:
                    old = peer.address
                    peer.address = body.address
                    self.counts["address_changed"] += 1
                    if not self._in_use(old):
                        self.dialing.pop(old, None)
                peer.capabilities, peer.dataset_size = body.capabilities, body.dataset_size
                peer.hello, peer.hello_timestamp_us = frame, hello.timestamp_us
            return peer
        if PROTOCOL_VERSION not in body.protocol_versions:
            self.counts["incompatible"] += 1
            return None
        if not self._has_room(candidates=False):
            self.counts["refused_full"] += 1
            return None
        peer = Peer(
            key=key,
            address=body.address,
            capabilities=body.capabilities,
            dataset_size=body.dataset_size,
            hello=frame,
            hello_timestamp_us=hello.timestamp_us,
            admitted_at=now,
            last_seen=now,
        )
        self.peers[key] = peer
        self.counts["admitted"] += 1
        self._forget_dialing(body.address)
        for address, entry in list(self.dialing.items()):
            if entry.key == key:
                del self.dialing[address]
        return peer

    def _evict(self, peer: Peer, now: float, why: str) -> list[Action]:
        del self.peers[peer.key]
        self.counts[f"evicted_{why}"] += 1
        actions: list[Action] = [] if self._in_use(peer.address) else [Hangup(peer.address)]
        if peer.address in self.settings.bootstrap:
            self._dial_later(peer.address, permanent=True, key=None, now=now + self.settings.dial_retry_initial_s)
        return actions

    def _dial_later(
        self, address: str, *, permanent: bool, key: bytes | None, now: float, hello_timestamp_us: int = 0
    ) -> None:
        self.dialing[address] = _Dialing(
            address,
            permanent,
            key,
            next_at=now,
            delay=self.settings.dial_retry_initial_s,
            hello_timestamp_us=hello_timestamp_us,
        )

    def _dial_now(self, entry: _Dialing, now: float) -> list[Action]:
        if not entry.opened:
            # A new connection refuses frames until ZeroMQ's handshake is done (IMMEDIATE=1):
            # open it now, send the first HELLO one retry interval later.
            entry.opened = True
            entry.next_at = now + entry.delay
            return [Dial(entry.address)]
        entry.attempts += 1
        entry.next_at = now + entry.delay
        entry.delay = min(entry.delay * 2, self.settings.dial_retry_max_s)
        return [Dial(entry.address), SendHello(entry.address)]

    def _answer_soon(self, peer: Peer, now: float) -> list[Action]:
        """Open the connection to a new peer; the PEERS we owe it goes out on a later tick."""
        peer.answer_at = now + self.settings.dial_retry_initial_s
        return [Dial(peer.address)]

    def _forget_dialing(self, address: str) -> None:
        self.dialing.pop(address, None)

    def _has_room(self, *, candidates: bool) -> bool:
        used = len(self.peers)
        if candidates:
            used += sum(1 for entry in self.dialing.values() if not entry.permanent)
        return used < self.settings.max_peers

    def _in_use(self, address: str) -> bool:
        return any(peer.address == address for peer in self.peers.values()) or address in self.dialing

    def _peers_body(self) -> Peers:
        others = [peer.hello for peer in self.peers.values()]
        own = [self.own_hello] if self.own_hello is not None else []
        sample = self.rng.sample(others, min(len(others), MAX_RELAYED_HELLOS - len(own)))
        return Peers(hellos=tuple(own + sample))

    @staticmethod
    def _addresses(peers) -> tuple[str, ...]:
        return tuple(sorted({peer.address for peer in peers}))
