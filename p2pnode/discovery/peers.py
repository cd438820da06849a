"""Who this node's peers are: admission, peer exchange, liveness, eviction, dialing with backoff.

`Membership` is a state machine with no I/O: the node feeds it verified messages and the time,
and carries out the actions it returns (dial, hang up, send, trust). That keeps every discovery
rule testable without sockets.

The handshake proves, both ways, that a key answers at the address it is admitted with. A node
learns of a key and its address from a signed HELLO (sent to it directly, relayed by a peer in
PEERS, or heard by LAN beacon) or only of an address (bootstrap). To *verify* it, the node
dials that address and sends its own HELLO then a challenge, PING(nonce). The other side, on
that HELLO, starts verifying this node the same way, and answers the challenge with PONG(nonce)
to the address in this node's HELLO, after its own HELLO. A signed PONG carrying the nonce
proves that its signer received what was sent to the address; only then is it admitted, with
that address. Once both have answered each other's challenge, both are *ready*: each admitted
the other before anything later arrives on the same connection.

Bounds against strangers with many keys (docs/security.md):
- Until a key is admitted, it gets no replay window (the node trusts it only on `Admitted`),
  its PEERS are not read, and its frames other than HELLO, PING and PONG are refused.
- Verifications in flight are bounded overall (`max_dialing`), per informant (the peer that
  relayed the address, or the source subnet of strangers' own HELLOs: `dialing_per_informant`;
  strangers' HELLOs together take at most half of `max_dialing`) and per target subnet
  (`dialing_per_subnet`, except when dialling back the host a HELLO came from), and each gives
  up after `dial_attempts` challenges; bootstrap addresses are retried forever.
- Only verified addresses are relayed; peers per subnet are bounded (`max_peers_per_subnet`).
- A full table admits a newcomer only by displacing a peer from the most crowded subnet, never
  one of the longest-lived or fastest-answering peers, and never a settled one (admitted
  `settled_after_s` ago): those leave only by their own silence or BYE.
PEERS never asks for an answer, so no exchange can loop.

Bounded views (HyParView-like, docs/daemon.md): the peers are the *active view*, at most
`max_peers`, connected and pinged. A node seeks `active_view` of them (at most `max_peers`):
below that it verifies relayed addresses at once, otherwise it keeps their signed HELLOs in a
bounded *passive view*, from which it later replaces a peer that leaves. A full node answers a
verified newcomer with a sample of its peers and BYE(`full`) instead of admitting it, so the
newcomer learns where to go and nobody already in is pushed out; one that comes back, still
short, may take the place of a peer with a surplus, but never of one admitted `settled_after_s`
ago or more (`_surplus_peer`). Only the active view is pinged, so liveness costs O(max_peers)
per node, whatever the size of the network.
"""

from __future__ import annotations

import ipaddress
import math
import random
from collections import Counter, OrderedDict
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

from ..discovery.settings import DiscoverySettings
from ..operations.metrics import UNKNOWN_PEER
from ..wire.gate import subnet_of

__all__ = [
    "Peer",
    "Membership",
    "Dial",
    "DialPeers",
    "Hangup",
    "SendHello",
    "Send",
    "Admitted",
    "Evicted",
    "Unreachable",
    "Action",
]


_U64 = (1 << 64) - 1
_HEARD = 256  # strangers' latest direct HELLOs kept for their PONG (least recently heard dropped)


@dataclass(frozen=True)
class Dial:
    """Open (if not open yet) the outbound connection to `address`, where `key` is expected
    (None: a bootstrap address given without its key). With CURVE the connection is encrypted
    to that key, so only its holder can complete the handshake."""

    address: str
    key: bytes | None = None


@dataclass(frozen=True)
class Hangup:
    """Close the outbound connection to `address`; with `flush`, after what is queued there
    went out (within the transport's linger time): a BYE that says why."""

    address: str
    flush: bool = False


@dataclass(frozen=True)
class SendHello:
    """Send a freshly signed HELLO to `address`, then report back with `hello_sent`."""

    address: str


@dataclass(frozen=True)
class Send:
    """Sign `body` once and send the frame to every address."""

    addresses: tuple[str, ...]
    body: Body


@dataclass(frozen=True)
class DialPeers:
    """Open the outbound connection to the peers' socket of the admitted peer at `address`
    (frames larger than the public bound go there): its HELLO's `peer_port` on its host."""

    address: str
    peers_address: str


@dataclass(frozen=True)
class Admitted:
    """`key` proved itself with the frame numbered `seq`: trust it from there on (replay window)."""

    key: bytes
    seq: int
    address: str


@dataclass(frozen=True)
class Evicted:
    """`key` is no peer any more: it is a stranger again."""

    key: bytes
    why: str


@dataclass(frozen=True)
class Unreachable:
    """The bootstrap address has left `attempts` challenges unanswered over `waited_s`: say so
    (once per streak); it is still retried, the next time in `next_in_s`."""

    address: str
    attempts: int
    waited_s: float
    next_in_s: float


Action = Dial | DialPeers | Hangup | SendHello | Send | Admitted | Evicted | Unreachable


@dataclass(frozen=True)
class Direct:
    """A HELLO sent to us by its own key, over a connection from host `source` (None: unknown)."""

    source: str | None


Informant = bytes | Direct | str  # a relaying peer's key, the sender itself, "beacon" or "bootstrap"


def _host(address: str) -> str:
    """The host of a tcp:// address, without IPv6 brackets."""
    return address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")


@dataclass
class Peer:
    key: bytes
    address: str  # where it answered this node's challenge
    capabilities: tuple[str, ...]
    dataset_size: int
    hello: bytes  # its latest signed HELLO frame, relayed verbatim in PEERS if it names `address`
    hello_timestamp_us: int
    admitted_at: float
    last_seen: float
    subnet: str | None  # of `address`; None where subnet limits do not apply
    rtt_s: float | None = None
    last_hello_at: float = float("-inf")  # when this node last re-sent its HELLO to it
    admitted_us: bool = False  # it admitted us: we answered its challenge, before anything else we send it
    hello_address: str = ""  # the address its latest HELLO names
    peer_port: int | None = None  # its peers' socket, on the host of `address` (HELLO.peer_port)
    hello_envelope: Envelope | None = None  # `hello`, decoded: what the passive view keeps of it
    # Peers it has, at least, as its latest PEERS showed (the relayable ones, up to 63): a full
    # node makes room for a newcomer only by dropping a peer that keeps its target without us.
    reported_peers: int = 0

    @property
    def peers_address(self) -> str | None:
        """Where its peers' socket is: the port it announced, on the host it was verified at."""
        if self.peer_port is None:
            return None
        return f"{self.address.rsplit(':', 1)[0]}:{self.peer_port}"

    @property
    def node_id(self) -> str:
        return node_id(self.key)

    @property
    def relayable(self) -> bool:
        """Its HELLO names the address it was verified at: others may be told of it."""
        return self.hello_address == self.address


@dataclass
class _Dialing:
    """A verification in flight: the address dialled, the challenge sent there."""

    address: str
    permanent: bool  # a bootstrap address: retried forever
    key: bytes | None  # the key expected there, when learned from a signed HELLO
    informant: Informant  # who told us: a relaying peer's key, the HELLO's sender itself, "beacon", "bootstrap"
    nonce: int
    next_at: float
    delay: float
    since: float  # when the first dial was due
    hello: tuple[Envelope, bytes] | None = None  # the signed HELLO that named this address
    attempts: int = 0
    opened: bool = False  # the outbound connection has been asked for
    owed_pong: int | None = None  # its challenge, answered right after our next HELLO there
    answered: bool = False  # we answered its challenge
    hello_out: bool = False  # our latest HELLO there was queued (not dropped: the connection was up)
    committed: bool = False  # we answered its challenge: it admits us, so we admit it (see _welcome)
    full: tuple[Envelope, bytes] | None = None  # verified, no room: redirected once it challenged us


@dataclass
class _Known:
    """A passive-view entry: a node that is no peer, its signed HELLO, who told us of it, the
    earliest time it is worth dialling (a node that said it is full is not asked again at once)
    and when it is forgotten (`hello_max_age_s` after it was heard, unless a newer HELLO came)."""

    hello: Envelope
    frame: bytes
    informant: Informant
    not_before: float
    expires_at: float


# BYE reasons that mean "I am fine, but not your peer": the sender stays in the passive view.
FULL, DISPLACED = "full", "displaced"


class Membership:
    def __init__(self, own_key: bytes, settings: DiscoverySettings, *, rng: random.Random, now: float) -> None:
        self.own_key = own_key
        self.settings = settings
        self.rng = rng
        self.peers: dict[bytes, Peer] = {}
        self.dialing: dict[str, _Dialing] = {}
        self.passive: dict[bytes, _Known] = {}  # key -> its latest signed HELLO (bounded: passive_view)
        self.own_hello: bytes | None = None
        self._exempt = tuple(ipaddress.ip_network(cidr) for cidr in settings.subnet_limits_exempt)
        # Key -> timestamp of the HELLO we gave up dialling: only a newer one is worth a new try.
        self._given_up: dict[bytes, int] = {}
        self._heard: OrderedDict[bytes, tuple[Envelope, bytes]] = OrderedDict()
        # Newcomers redirected lately (at most _HEARD), with their HELLO where it names the
        # address where they answered: they are short of peers, so the next ones are sent there.
        self._redirected: OrderedDict[bytes, bytes | None] = OrderedDict()
        # Keys we found no room with, both of us full (latest _HEARD): their HELLOs are not
        # verified again before the time noted, or each one's retry starts the other's anew.
        self._full_until: OrderedDict[bytes, float] = OrderedDict()
        self.counts: Counter[str] = Counter()  # admitted, evicted_*, refused_*, dial_budget_*, ...
        self._ping_nonce: int | None = None
        self._ping_sent_at = 0.0
        self._next_ping_at = now
        self._next_gossip_at = now + settings.exchange_interval_s
        self._bootstrap = dict(settings.bootstrap_peers())  # address -> its key, if configured
        for address, key in self._bootstrap.items():
            self._dial_later(address, permanent=True, key=key, informant="bootstrap", now=now)

    # --- what the node tells us ----------------------------------------------------------

    def set_own_hello(self, frame: bytes) -> None:
        """This node's latest signed HELLO, put first in every PEERS it sends."""
        self.own_hello = frame

    def on_message(
        self,
        envelope: Envelope,
        frame: bytes,
        now: float,
        now_us: int,
        relayed: list[tuple[Envelope, bytes]] = (),
        *,
        source: str | None = None,
    ) -> tuple[list[Action], str | None]:
        """A verified discovery message (DISCOVERY_TYPES); `relayed` holds a PEERS' entries,
        already verified; `source` is the host its connection comes from, if known. Returns the
        actions, and the reason it is refused, if it is."""
        is_peer = self.on_frame(envelope.sender, now)
        kind, body = envelope.type, envelope.body
        if kind is MessageType.HELLO:
            return self.on_hello(envelope, frame, now, source=source), None
        if kind is MessageType.PING:
            return self.on_ping(envelope.sender, body)
        if kind is MessageType.PONG:
            return self.on_pong(envelope, now), None
        if not is_peer:
            return [], UNKNOWN_PEER  # PEERS and BYE mean something only from a peer
        if kind is MessageType.PEERS:
            return self.on_peers(envelope, list(relayed), now, now_us), None
        return self.on_bye(envelope.sender, now, body.reason), None

    def on_hello(self, envelope: Envelope, frame: bytes, now: float, *, source: str | None = None) -> list[Action]:
        """A HELLO received directly, over a connection from host `source`: its sender is
        dialing us, and will challenge us next."""
        key, body = envelope.sender, envelope.body
        if key == self.own_key:
            self.dialing.pop(body.address, None)  # we dialled ourselves (our own bootstrap)
            self._bootstrap.pop(body.address, None)  # and never again, not even to rejoin
            return [Hangup(body.address)]
        if PROTOCOL_VERSION not in body.protocol_versions:
            self.counts["incompatible"] += 1
            return []
        peer = self.peers.get(key)
        if peer is not None:
            actions = self._update(peer, envelope, frame)
            if now - peer.last_hello_at < self.settings.dial_retry_initial_s:
                return actions  # answered a moment ago (bounds what repeated HELLOs cost us)
            # It (re)connected to us, maybe restarted and forgot us: our HELLO goes first on our
            # connection there, so that it can bind that connection and take our answers.
            peer.last_hello_at = now
            return [*actions, SendHello(peer.address)]
        if self._full_until.get(key, -math.inf) > now:
            return []
        self._heard[key] = (envelope, frame)
        self._heard.move_to_end(key)
        while len(self._heard) > _HEARD:
            self._heard.popitem(last=False)
        entry = self.dialing.get(body.address)
        if entry is not None:
            if entry.key in (None, key):
                entry.key, entry.hello = key, (envelope, frame)
            return []
        return self._verify(envelope, frame, Direct(source), now)

    def on_peers(
        self, envelope: Envelope, relayed: list[tuple[Envelope, bytes]], now: float, now_us: int
    ) -> list[Action]:
        """PEERS from a peer; `relayed` holds its HELLO entries, already verified."""
        actions: list[Action] = []
        sender = self.peers[envelope.sender]
        sender.admitted_us = True  # only a peer that admitted us sends PEERS
        sender.reported_peers = len(envelope.body.hellos) - 1  # all but its own
        for hello, frame in relayed:
            if hello.sender == envelope.sender:
                actions += self._update(self.peers[envelope.sender], hello, frame)
            else:
                actions += self.on_announced(hello, frame, now, now_us, informant=envelope.sender)
        return actions

    def on_announced(
        self, hello: Envelope, frame: bytes, now: float, now_us: int, informant: Informant = "beacon"
    ) -> list[Action]:
        """A signed HELLO heard second hand (relayed by `informant`, or a LAN beacon): verify it."""
        key = hello.sender
        if key == self.own_key:
            return []
        if abs(now_us - hello.timestamp_us) > self.settings.hello_max_age_s * 1e6:
            self.counts["stale_hello"] += 1
            return []
        peer = self.peers.get(key)
        if peer is not None:
            return self._update(peer, hello, frame)
        if hello.body.address in self.dialing or hello.timestamp_us <= self._given_up.get(key, -1):
            return []
        if PROTOCOL_VERSION not in hello.body.protocol_versions:
            return []
        known = self.passive.get(key)
        if not self._seeking() or (known is not None and known.not_before > now):
            # Enough peers: kept to replace one that leaves. Or it sent us on a moment ago: every
            # sample relaying it again would have us ask again, and be sent on again, at once.
            self._remember(hello, frame, informant, now)
            return []
        return self._verify(hello, frame, informant, now)

    def on_ping(self, key: bytes, ping: Ping) -> tuple[list[Action], str | None]:
        """A PING: liveness from a peer, or the challenge of a key we are verifying in turn."""
        peer = self.peers.get(key)
        if peer is not None:
            answer: list[Action] = [Send((peer.address,), Pong(nonce=ping.nonce))]
            if not peer.admitted_us:  # its challenge: answered, it admits us before what follows
                answer += self._ready(peer)
            return answer, None
        entry = self._dialing_for(key)
        if entry is None:
            return [], UNKNOWN_PEER  # a key we are not verifying: no dial, no answer
        entry.answered = True
        if not entry.committed:
            # Our answer makes it admit us: give it only with a place kept for it, so that no
            # node admits a peer that drops it a moment later. Without room it is answered with
            # the redirect, once it has answered our challenge (its address is verified).
            entry.committed = entry.permanent or self._welcome(key)
        if not entry.committed:
            entry.owed_pong = ping.nonce
            return (self._redirect(entry, *entry.full) if entry.full is not None else []), None
        if not entry.hello_out:
            # Our HELLO must go first on that connection: a PONG opening it would be refused
            # there (handshake_first). Not out yet, or dropped while the connection came up.
            entry.owed_pong = ping.nonce
            return [], None
        return [Send((entry.address,), Pong(nonce=ping.nonce))], None

    def on_pong(self, envelope: Envelope, now: float) -> list[Action]:
        key, nonce = envelope.sender, envelope.body.nonce
        peer = self.peers.get(key)
        if peer is not None:
            if nonce == self._ping_nonce:
                peer.rtt_s = now - self._ping_sent_at
            return []
        entry = next((e for e in self.dialing.values() if e.nonce == nonce), None)
        if entry is None:
            self.counts["unexpected_pong"] += 1
            return []
        hello = entry.hello if entry.hello is not None and entry.hello[0].sender == key else self._heard.get(key)
        if hello is None or hello[0].sender != key:
            self.counts["pong_without_hello"] += 1  # it never said who it is; its HELLO may follow
            return []
        return self._admit(entry, *hello, seq=envelope.seq, now=now)

    def hello_sent(self, address: str, ok: bool, now: float) -> list[Action]:
        """Outcome of a SendHello. A dropped HELLO is counted, and the node then sends nothing
        after it to that address in the same batch; the schedule is the dial's own."""
        entry = self.dialing.get(address)
        if entry is not None:
            entry.hello_out = ok
            if ok and entry.committed:
                entry.owed_pong = None  # it followed that HELLO (`_dial_now`)
            else:
                self.counts["hello_not_sent"] += 1  # and the node sends nothing after it there
        return []

    def ready(self) -> list[Peer]:
        """The peers that have admitted this node too, or will before anything else we send
        them arrives (our answer to their challenge went out first on that connection). Only
        these are pinged and sent learning payloads: the others would refuse them."""
        return [peer for peer in self.peers.values() if peer.admitted_us]

    def on_frame(self, key: bytes, now: float) -> bool:
        """Any verified frame from `key`; True if it is a peer."""
        peer = self.peers.get(key)
        if peer is None:
            return False
        peer.last_seen = now
        return True

    def on_bye(self, key: bytes, now: float, reason: str = "shutdown") -> list[Action]:
        """A peer leaves: it shuts down, or it is full (`full`: it redirected us) or pushed us
        out (`displaced`); those two stay in the passive view."""
        peer = self.peers.get(key)
        if peer is None:
            return []
        return self._evict(peer, now, f"bye_{reason}" if reason in (FULL, DISPLACED) else "bye")

    @property
    def target(self) -> int:
        """How many peers this node seeks (`active_view`, never more than it may hold)."""
        return min(self.settings.active_view, self.settings.max_peers)

    def _seeking(self) -> bool:
        """Fewer peers than the target, counting the verifications in flight (each may become one)."""
        learned = sum(not entry.permanent for entry in self.dialing.values())
        return len(self.peers) + learned < self.target

    def next_due(self, now: float) -> float:
        """When `tick` next has work: a ping or gossip round, a dial, a peer's timeout, a fill
        from the passive view, a rejoin. The node sleeps until then (or until a message changes
        it): an idle node wakes a few times a second, not at every dial retry interval."""
        due = [self._next_ping_at, self._next_gossip_at, *(entry.next_at for entry in self.dialing.values())]
        if self.peers:
            due.append(min(peer.last_seen for peer in self.peers.values()) + self.settings.peer_timeout_s)
        elif self._bootstrap and not any(entry.permanent for entry in self.dialing.values()):
            due.append(now)  # alone: rejoin
        if self.passive and self._seeking():
            due.append(min(entry.not_before for entry in self.passive.values()))
        return max(now, min(due))

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: evict the silent, ping the rest, retry dials, fill the active view
        from the passive one, gossip peers."""
        actions: list[Action] = []
        for peer in list(self.peers.values()):
            if now - peer.last_seen > self.settings.peer_timeout_s:
                actions += self._evict(peer, now, "timeout")
        if not self.peers and not any(entry.permanent for entry in self.dialing.values()):
            for address, key in self._bootstrap.items():  # alone: join again where we joined first
                self._dial_later(address, permanent=True, key=key, informant="bootstrap", now=now)
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
        if self.passive and self._seeking():
            actions += self._fill(now)
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

    # --- verification --------------------------------------------------------------------

    def _verify(self, hello: Envelope, frame: bytes, informant: Informant, now: float) -> list[Action]:
        """Start verifying the key and address of `hello`, if the budgets allow. A newcomer that
        dials us is verified even when the table is full: it is then redirected (`_admit`).
        A relayed HELLO that cannot be verified now is kept in the passive view."""
        address = hello.body.address
        subnet = self._subnet(address)
        refusal = self._over_dial_budget(address, informant) or self._no_room_for(
            subnet, now, newcomer=isinstance(informant, Direct)
        )
        if refusal is not None:
            self.counts[refusal] += 1
            self._remember(hello, frame, informant, now)
            return []
        self._dial_later(address, permanent=False, key=hello.sender, informant=informant, now=now)
        entry = self.dialing[address]
        entry.hello = (hello, frame)
        return self._dial_now(entry, now)  # opens the connection; HELLO and challenge follow

    def _over_dial_budget(self, address: str, informant: Informant) -> str | None:
        s = self.settings
        learned = [entry for entry in self.dialing.values() if not entry.permanent]
        if len(learned) >= s.max_dialing:
            return "dial_budget_full"
        if isinstance(informant, bytes) and sum(e.informant == informant for e in learned) >= s.dialing_per_informant:
            return "dial_budget_informant"
        source = self._host_subnet(informant.source) if isinstance(informant, Direct) else None
        if source is not None:
            # Strangers' own HELLOs: a few at once per source subnet (its keys cost it nothing),
            # and never more than half of the budget, so addresses relayed by peers get room.
            # Exempt sources (loopback: this very host) are trusted as the subnet limits trust them.
            direct = [e for e in learned if isinstance(e.informant, Direct) and self._host_subnet(e.informant.source)]
            if len(direct) >= s.max_dialing // 2:
                return "dial_budget_direct"
            if sum(self._host_subnet(e.informant.source) == source for e in direct) >= s.dialing_per_informant:
                return "dial_budget_source"
        # Dialling back the host a HELLO came from reflects nothing onto anyone else.
        dialling_back = isinstance(informant, Direct) and _host(address) == informant.source
        subnet = self._subnet(address)
        if (
            not dialling_back
            and subnet is not None
            and sum(self._subnet(e.address) == subnet for e in learned) >= s.dialing_per_subnet
        ):
            return "dial_budget_subnet"
        return None

    def _admit(self, entry: _Dialing, hello: Envelope, frame: bytes, *, seq: int, now: float) -> list[Action]:
        """`hello`'s key answered the challenge sent to `entry.address`: admit it there, or,
        with the table full, redirect it."""
        subnet = self._subnet(entry.address)
        key = hello.sender
        refusal = self._no_room_for(subnet, now)
        full = len(self.peers) >= self.settings.max_peers  # then the subnet rule may displace (#14)
        surplus = None
        if refusal is None and not full and not (entry.permanent or entry.committed or self._welcome(key)):
            surplus = self._surplus_peer(now) if key in self._redirected else None
            refusal = "refused_full" if surplus is None else None
        if refusal == "refused_full":
            if entry.answered:
                return self._redirect(entry, hello, frame)
            entry.full = (hello, frame)  # it would refuse our sample before our answer: wait for its challenge
            return []
        if refusal is not None:
            self.counts[refusal] += 1
            return [] if entry.permanent else self._stop_dialing(entry)  # a bootstrap is retried
        actions = self._make_room(subnet, now) if surplus is None else self._evict(surplus, now, "displaced")
        peer = Peer(
            key=key,
            address=entry.address,
            capabilities=hello.body.capabilities,
            dataset_size=hello.body.dataset_size,
            hello=frame,
            hello_timestamp_us=hello.timestamp_us,
            hello_address=hello.body.address,
            peer_port=hello.body.peer_port,
            hello_envelope=hello,
            admitted_at=now,
            last_seen=now,
            subnet=subnet,
        )
        self.peers[key] = peer
        self.counts["admitted"] += 1
        self._heard.pop(key, None)
        self.passive.pop(key, None)
        for address, other in list(self.dialing.items()):
            if other is entry or (other.key == key and not other.permanent):
                del self.dialing[address]
        actions.append(Admitted(key, seq, entry.address))
        if peer.peers_address is not None:
            actions.append(DialPeers(peer.address, peer.peers_address))
        if entry.answered:
            if entry.owed_pong is not None:  # its challenge, held back (no place was kept): answered now
                if not entry.hello_out:
                    actions.append(SendHello(entry.address))
                actions.append(Send((entry.address,), Pong(nonce=entry.owed_pong)))
            actions += self._ready(peer)
        return actions

    def _welcome(self, key: bytes) -> bool:
        """Whether a node that answered our challenge gets in (room permitting, max_peers):
        while we are below the target; one more, if it is a newcomer we sent elsewhere before
        and it is back, so still short of peers. Without that slack two nodes one peer short
        each, already peers of each other, would wait forever; with more of it, or for anyone,
        the first nodes everyone joins through fill up and the latecomers find no room."""
        kept = len(self.peers) + sum(entry.committed for entry in self.dialing.values())
        if kept >= self.settings.max_peers:
            return False
        return kept < self.target or (kept == self.target and key in self._redirected)

    def _surplus_peer(self, now: float) -> Peer | None:
        """A peer that has more than the target without us (its latest PEERS says so) and is not
        settled (`_unsettled`): the one a newcomer that came back, still short of peers, may take
        the place of. Nobody falls below the target for it, so this cannot start a chain of nodes
        pushing each other out. The surplus is what the peer's PEERS say, and Sybils can give it
        one by being sent on to it: hence never a settled peer (#14)."""
        spare = [p for p in self._unsettled(now) if p.reported_peers - 1 >= self.target]
        return max(spare, key=lambda p: p.reported_peers, default=None)

    def _unsettled(self, now: float) -> list[Peer]:
        """The peers a newcomer may ever take the place of, longest-lived first: admitted less
        than `settled_after_s` ago, and not in the longest-lived or fastest-answering quarter of
        the table. A settled peer is never displaced, however many keys and subnets a newcomer
        has: it leaves only by its own silence or BYE."""
        quarter = max(1, self.settings.max_peers // 4)
        by_age = sorted(self.peers.values(), key=lambda p: p.admitted_at)
        by_rtt = sorted(self.peers.values(), key=lambda p: float("inf") if p.rtt_s is None else p.rtt_s)
        protected = {p.key for p in by_age[:quarter]} | {p.key for p in by_rtt[:quarter]}
        young = now - self.settings.settled_after_s
        return [p for p in by_age if p.admitted_at > young and p.key not in protected]

    def _redirect(self, entry: _Dialing, hello: Envelope, frame: bytes) -> list[Action]:
        """No room: the verified newcomer at `entry` (which admitted us: we answered its
        challenge) gets, to dial instead, some of the newcomers we redirected lately (short of
        peers too, they have room: HyParView's forwarded join, in one hop; drawn at random from
        the latest few, as the latest alone would string newcomers into a chain) and a sample of
        our peers; then BYE(`full`). Nobody already in is pushed out, so strangers with many
        keys cannot churn the table; the newcomer keeps us in its passive view."""
        self.counts["refused_full"] += 1
        self.counts["redirected"] += 1
        key = hello.sender
        recent = [relay for other, relay in reversed(self._redirected.items()) if other != key and relay]
        others = recent[: 4 * self.target]  # the latest are likelier to have room still
        self._redirected[key] = frame if hello.body.address == entry.address else None  # verified there
        self._redirected.move_to_end(key)
        while len(self._redirected) > _HEARD:
            self._redirected.popitem(last=False)
        self.dialing.pop(entry.address, None)
        actions: list[Action] = []
        if entry.owed_pong is not None:  # our answer first: only then does it take our sample
            actions += [SendHello(entry.address), Send((entry.address,), Pong(nonce=entry.owed_pong))]
        sample = self._peers_body(first=self.rng.sample(others, min(len(others), self.target)))
        actions += [Send((entry.address,), sample), Send((entry.address,), Bye(reason=FULL))]
        if not self._in_use(entry.address):
            actions.append(Hangup(entry.address, flush=True))
        return actions

    def _ready(self, peer: Peer) -> list[Action]:
        """We answered its challenge: it admits us once that answer arrives, before our PEERS
        behind it on the same connection (the gate there parks the PEERS if it reads both at once)."""
        peer.admitted_us = True
        return [Send((peer.address,), self._peers_body())]

    def _no_room_for(self, subnet: str | None, now: float, *, newcomer: bool = False) -> str | None:
        """Why a node from `subnet` could not be admitted now, or None. A `newcomer` (it dialled
        us) is not refused for a full table before it is verified: it is redirected then."""
        if subnet is not None and self._subnet_counts()[subnet] >= self.settings.max_peers_per_subnet:
            return "refused_subnet"
        if not newcomer and len(self.peers) >= self.settings.max_peers and self._displaceable(subnet, now) is None:
            return "refused_full"
        return None

    def _make_room(self, subnet: str | None, now: float) -> list[Action]:
        if len(self.peers) < self.settings.max_peers:
            return []
        victim = self._displaceable(subnet, now)
        return self._evict(victim, now, "displaced") if victim is not None else []

    def _displaceable(self, subnet: str | None, now: float) -> Peer | None:
        """The peer a newcomer from `subnet` may displace from a full table: the youngest of the
        most crowded subnet, if that holds at least two more peers than the newcomer's, and
        never a settled one (`_unsettled`)."""
        counts = self._subnet_counts()
        if not counts:
            return None
        crowded, most = counts.most_common(1)[0]
        if most < counts[subnet] + 2:
            return None
        victims = [p for p in self._unsettled(now) if p.subnet == crowded]
        return victims[-1] if victims else None

    def _subnet_counts(self) -> Counter[str]:
        return Counter(peer.subnet for peer in self.peers.values() if peer.subnet is not None)

    def _subnet(self, address: str) -> str | None:
        """The subnet of an address's host, or None where the limits do not apply (loopback by
        default: all of it is this very host) or the host is a name."""
        return self._host_subnet(_host(address))

    def _host_subnet(self, host: str | None) -> str | None:
        if host is None:
            return None
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return f"name:{host}"
        if any(ip in network for network in self._exempt):
            return None
        return subnet_of(host)

    # --- internals -----------------------------------------------------------------------

    def _update(self, peer: Peer, hello: Envelope, frame: bytes) -> list[Action]:
        """A newer signed HELLO of a peer: new capabilities and peers' port (dialled anew: it
        may have restarted on another one); the address stays the verified one."""
        if hello.timestamp_us < peer.hello_timestamp_us:
            return []
        body: Hello = hello.body
        peer.capabilities, peer.dataset_size = body.capabilities, body.dataset_size
        peer.hello, peer.hello_timestamp_us, peer.hello_address = frame, hello.timestamp_us, body.address
        peer.hello_envelope = hello
        if body.peer_port == peer.peer_port:
            return []
        peer.peer_port = body.peer_port
        return [] if peer.peers_address is None else [DialPeers(peer.address, peer.peers_address)]

    def _dialing_for(self, key: bytes) -> _Dialing | None:
        return next((entry for entry in self.dialing.values() if entry.key == key), None)

    def _evict(self, peer: Peer, now: float, why: str) -> list[Action]:
        """Drop `peer`. One that is alive but no peer of ours any more (we displaced it, or it
        said it is full or displaced us) goes to the passive view; a silent or departed one does not."""
        del self.peers[peer.key]
        self.counts[f"evicted_{why}"] += 1
        actions: list[Action] = [Evicted(peer.key, why)]
        alive = why in ("displaced", f"bye_{FULL}", f"bye_{DISPLACED}")
        if why == "displaced":
            actions.append(Send((peer.address,), Bye(reason=DISPLACED)))  # it need not wait for silence
        if alive and peer.hello_envelope is not None and peer.relayable:
            self._remember(peer.hello_envelope, peer.hello, "demoted", now, wait=self.settings.dial_retry_max_s)
        if not self._in_use(peer.address):
            actions.append(Hangup(peer.address, flush=why == "displaced"))
        if peer.address in self._bootstrap and not alive and len(self.peers) < self.target:
            # A bootstrap peer lost while we need peers is dialled again. One that is full is
            # not: it would only send us on again (a node left alone rejoins through it, `tick`).
            self._dial_later(
                peer.address,
                permanent=True,
                key=self._bootstrap[peer.address],
                informant="bootstrap",
                now=now + self.settings.dial_retry_initial_s,
            )
        return actions

    # --- the passive view ----------------------------------------------------------------

    def _remember(self, hello: Envelope, frame: bytes, informant: Informant, now: float, *, wait: float = 0.0) -> None:
        """Keep a relayed (so verified by the peer that relayed it) or demoted peer's HELLO in
        the passive view. When it is full, an entry from the informant with the most entries
        (this one's, in a tie) makes room, so that one lying peer cannot fill it with addresses
        nobody answers at."""
        key = hello.sender
        if not isinstance(informant, bytes) and informant != "demoted":
            return  # a stranger's own HELLO or a beacon: nobody verified that address
        if key == self.own_key or key in self.peers:
            return
        known = self.passive.get(key)
        if known is not None and known.hello.timestamp_us >= hello.timestamp_us:
            return  # the same or an older HELLO: the first informant keeps it
        if known is None and len(self.passive) >= self.settings.passive_view:
            counts = Counter(entry.informant for entry in self.passive.values())
            crowded = informant if counts[informant] == max(counts.values()) else counts.most_common(1)[0][0]
            victims = [k for k, entry in self.passive.items() if entry.informant == crowded]
            del self.passive[self.rng.choice(victims)]
        self.passive[key] = _Known(hello, frame, informant, now + wait, now + self.settings.hello_max_age_s)

    def _fill(self, now: float) -> list[Action]:
        """Below the target: verify addresses from the passive view, in random order, as far as
        the dial budgets allow (an entry over budget waits for a later tick)."""
        actions: list[Action] = []
        keys = [key for key, entry in self.passive.items() if entry.not_before <= now]
        self.rng.shuffle(keys)
        for key in keys:
            if not self._seeking():
                break
            entry = self.passive[key]
            hello, address = entry.hello, entry.hello.body.address
            if now >= entry.expires_at or hello.timestamp_us <= self._given_up.get(key, -1):
                del self.passive[key]
                continue
            if address in self.dialing:
                continue
            if self._over_dial_budget(address, entry.informant) or self._no_room_for(self._subnet(address), now):
                continue
            del self.passive[key]
            self.counts["passive_dialled"] += 1
            actions += self._verify(hello, entry.frame, entry.informant, now)
        return actions

    def _dial_later(
        self, address: str, *, permanent: bool, key: bytes | None, informant: Informant, now: float
    ) -> None:
        self.dialing[address] = _Dialing(
            address,
            permanent,
            key,
            informant,
            nonce=self.rng.randint(0, _U64),
            next_at=now,
            delay=self.settings.dial_retry_initial_s,
            since=now,
        )

    def _dial_now(self, entry: _Dialing, now: float) -> list[Action]:
        if entry.permanent and len(self.peers) >= self.target:
            return self._stop_dialing(entry)  # enough peers: the bootstrap is for joining, or rejoining
        if entry.answered and not entry.committed and entry.attempts >= 2 and not entry.permanent:
            # We hold its challenge (no room) and it has not answered ours twice: it holds ours
            # too, for the same reason. Neither wants the other: let go, for a while.
            self.counts["gave_up_full"] += 1
            if entry.key is not None:
                self._full_until[entry.key] = now + self.settings.dial_retry_max_s
                self._full_until.move_to_end(entry.key)
                while len(self._full_until) > _HEARD:
                    self._full_until.popitem(last=False)
            return self._stop_dialing(entry)
        if not entry.opened:
            # A new connection refuses frames until ZeroMQ's handshake is done (IMMEDIATE=1):
            # open it now, send HELLO and the challenge one retry interval later.
            entry.opened = True
            entry.next_at = now + entry.delay
            return [Dial(entry.address, entry.key)]
        if not entry.permanent and entry.attempts >= self.settings.dial_attempts:
            self.counts["gave_up"] += 1
            if entry.key is not None and entry.hello is not None:
                if len(self._given_up) >= 4 * self.settings.max_peers:
                    self._given_up.clear()  # bounded; forgetting only costs a few more HELLOs
                self._given_up[entry.key] = entry.hello[0].timestamp_us
            return self._stop_dialing(entry)
        actions: list[Action] = []
        if entry.permanent and entry.attempts == self.settings.dial_attempts:
            self.counts["bootstrap_unreachable"] += 1
            actions.append(Unreachable(entry.address, entry.attempts, now - entry.since, entry.delay))
        entry.attempts += 1
        entry.next_at = now + entry.delay
        entry.delay = min(entry.delay * 2, self.settings.dial_retry_max_s)
        actions += [
            Dial(entry.address, entry.key),
            SendHello(entry.address),
            Send((entry.address,), Ping(nonce=entry.nonce)),
        ]
        if entry.owed_pong is not None and entry.committed:  # owed until `hello_sent` says our HELLO went out
            actions.append(Send((entry.address,), Pong(nonce=entry.owed_pong)))
        return actions

    def _stop_dialing(self, entry: _Dialing) -> list[Action]:
        self.dialing.pop(entry.address, None)
        return [] if self._in_use(entry.address) else [Hangup(entry.address)]

    def _in_use(self, address: str) -> bool:
        return any(peer.address == address for peer in self.peers.values()) or address in self.dialing

    def _peers_body(self, first: list[bytes] = ()) -> Peers:
        """Our own HELLO, the verified HELLOs `first`, then a random sample of our relayable peers'."""
        others = [peer.hello for peer in self.peers.values() if peer.relayable]
        head = ([self.own_hello] if self.own_hello is not None else []) + list(first)[: MAX_RELAYED_HELLOS - 1]
        sample = self.rng.sample(others, min(len(others), MAX_RELAYED_HELLOS - len(head)))
        return Peers(hellos=tuple(head + sample))

    @staticmethod
    def _addresses(peers) -> tuple[str, ...]:
        return tuple(sorted({peer.address for peer in peers}))
