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
  its PEERS are not read, and its frames other than HELLO, PING and PONG are refused, but for
  a dial-back's request and answer (DIAL_ME, DIALED: dial_back.py, bounded there).
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
ago or more (`Room.surplus_peer`). Only the active view is pinged, so liveness costs O(max_peers)
per node, whatever the size of the network.

`Membership` handles the messages and the time, and decides. Its parts, each with its own state
and neither I/O nor clock: `Dials` (dialing.py: verifications in flight, their budgets and
retries), `Passive` (passive.py: the passive view), `Room` (admission.py: the target, the subnet
limits, whom a newcomer may displace), `Subnets` (subnets.py), `Peer` (peer.py); the actions
are in actions.py. They read the peer table; only `Membership` changes it.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict

from protocol import (
    MAX_RELAYED_HELLOS,
    PROTOCOL_VERSION,
    Bye,
    DialMe,
    Envelope,
    MessageType,
    Peers,
    Ping,
    Pong,
)
from protocol.messages import is_client_address

from ..metrics import UNKNOWN_PEER
from .actions import Action, Admitted, DialBack, DialPeers, Direct, Evicted, Hangup, Informant, Send, SendHello
from .admission import Room
from .dial_back import UNEXPECTED_DIALED, DialBacks
from .dialing import STRANGERS, Dialing, Dials
from .passive import Passive
from .peer import Peer
from .reachability import PUBLIC, Reachability
from .settings import DiscoverySettings
from .subnets import Subnets, port_of

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["Peer", "Membership"]


_U64 = (1 << 64) - 1

# BYE reasons that mean "I am fine, but not your peer": the sender stays in the passive view.
FULL, DISPLACED = "full", "displaced"


def _addresses(peers) -> tuple[str, ...]:
    return tuple(sorted({peer.address for peer in peers}))


class Membership:
    """This node's discovery, as a state machine (module docstring): messages and time in, actions out."""

    def __init__(
        self, own_key: bytes, settings: DiscoverySettings, *, rng: random.Random, now: float, advertised: str = ""
    ) -> None:
        """`advertised`: the address this node's HELLO gives, which it asks to be dialled back at
        while it is not known to be reachable there (dial_back.py); "": it never asks."""
        self.own_key = own_key
        self.advertised = advertised
        self.settings = settings
        self.rng = rng
        self.peers: dict[bytes, Peer] = {}  # the active view; the parts below read it, only Membership changes it
        self.counts: Counter[str] = Counter()  # admitted, evicted_*, refused_*, dial_budget_*, ...
        self._subnets = Subnets(settings.subnet_limits_exempt)
        self.dialing = Dials(settings, self._subnets, self.peers, self.counts)  # address -> verification in flight
        self.passive = Passive(own_key, settings, self.peers)  # key -> its latest signed HELLO (bounded)
        self.room = Room(settings, self.peers, self.dialing)
        self.reachability = Reachability(settings.reachability_confirmations)  # whose challenges reached us
        self.dial_backs = DialBacks(
            settings.dial_back_interval_s,
            settings.max_dial_backs,
            asks=settings.reachability_confirmations,
            first_at=now + settings.dial_back_after_s,
            now=now,
        )
        self.own_hello: bytes | None = None
        # Client peers this node relays for (relay/): their HELLOs go in its PEERS too, so that
        # others reach them through it.
        self.relayed_clients: list[bytes] = []
        # Strangers' latest direct HELLOs, kept for their PONG (least recently heard dropped).
        self._heard: OrderedDict[bytes, tuple[Envelope, bytes]] = OrderedDict()
        # Newcomers redirected lately (at most STRANGERS), with their HELLO where it names the
        # address where they answered: they are short of peers, so the next ones are sent there.
        self._redirected: OrderedDict[bytes, bytes | None] = OrderedDict()
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
        if kind in (MessageType.DIAL_ME, MessageType.DIALED):
            return self.on_dial_back(envelope, now, source)
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
            self.dialing.drop(body.address)  # we dialled ourselves (our own bootstrap)
            self._bootstrap.pop(body.address, None)  # and never again, not even to rejoin
            return [Hangup(body.address)]
        if PROTOCOL_VERSION not in body.protocol_versions:
            self.counts["incompatible"] += 1
            return []
        peer = self.peers.get(key)
        if peer is not None:
            actions = peer.update(envelope, frame)
            if now - peer.last_hello_at < self.settings.dial_retry_initial_s:
                return actions  # answered a moment ago (bounds what repeated HELLOs cost us)
            # It (re)connected to us, maybe restarted and forgot us: our HELLO goes first on our
            # connection there, so that it can bind that connection and take our answers.
            peer.last_hello_at = now
            return [*actions, SendHello(peer.address)]
        if self.dialing.full_with(key, now):
            return []
        self._heard[key] = (envelope, frame)
        self._heard.move_to_end(key)
        while len(self._heard) > STRANGERS:
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
                actions += self.peers[envelope.sender].update(hello, frame)
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
            return peer.update(hello, frame)
        if hello.body.address in self.dialing or self.dialing.gave_up_on(hello):
            return []
        if PROTOCOL_VERSION not in hello.body.protocol_versions:
            return []
        known = self.passive.get(key)
        if not self.room.seeking() or (known is not None and known.not_before > now):
            # Enough peers: kept to replace one that leaves. Or it sent us on a moment ago: every
            # sample relaying it again would have us ask again, and be sent on again, at once.
            self.passive.remember(hello, frame, informant, now, self.rng)
            return []
        return self._verify(hello, frame, informant, now)

    def on_ping(self, key: bytes, ping: Ping) -> tuple[list[Action], str | None]:
        """A PING: liveness from a peer, or the challenge of a key we are verifying in turn."""
        peer = self.peers.get(key)
        if peer is not None:
            answer: list[Action] = [Send((peer.address,), Pong(nonce=ping.nonce))]
            if not peer.admitted_us:  # its challenge: answered, it admits us before what follows
                self.reachability.challenged(key)
                peer.admitted_us = True
                answer.append(Send((peer.address,), self._peers_body()))
            return answer, None
        entry = self.dialing.for_key(key)
        if entry is None:
            return [], UNKNOWN_PEER  # a key we are not verifying: no dial, no answer
        entry.answered = True
        self.reachability.challenged(key)  # it dialled the address our HELLO gave it
        if not entry.committed:
            # Our answer makes it admit us: give it only with a place kept for it, so that no
            # node admits a peer that drops it a moment later. Without room it is answered with
            # the redirect, once it has answered our challenge (its address is verified).
            entry.committed = entry.permanent or self.room.welcome(key in self._redirected)
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
        entry = self.dialing.for_nonce(nonce)
        if entry is None:
            self.counts["unexpected_pong"] += 1
            return []
        hello = entry.hello if entry.hello is not None and entry.hello[0].sender == key else self._heard.get(key)
        if hello is None or hello[0].sender != key:
            self.counts["pong_without_hello"] += 1  # it never said who it is; its HELLO may follow
            return []
        return self._admit(entry, *hello, seq=envelope.seq, now=now)

    def on_dial_back(self, envelope: Envelope, now: float, source: str | None) -> tuple[list[Action], str | None]:
        """DIAL_ME, from anyone (bounded: dial_back.py), over a connection from host `source`; or
        DIALED, the answer to one of ours: its sender reached this node at the address it names."""
        body = envelope.body
        if envelope.type is MessageType.DIAL_ME:
            address, declined = self.dial_backs.requested(source, body.port, now)
            if declined is not None:  # a fair request, not now: counted, not refused as a bad frame
                self.counts[declined] += 1
                return [], None
            self.counts["dial_backs"] += 1
            return [DialBack(address, envelope.sender, body.nonce)], None
        if not self.dial_backs.answered(body.nonce, now):
            self.counts[UNEXPECTED_DIALED] += 1
            return [], UNEXPECTED_DIALED
        self.reachability.reached_by_dial_back(
            envelope.sender, body.address, advertised=body.address == self.advertised
        )
        return [], None

    def hello_sent(self, address: str, ok: bool, now: float) -> list[Action]:
        """Outcome of a SendHello. A dropped HELLO is counted, and the node then sends nothing
        after it to that address in the same batch; the schedule is the dial's own."""
        self.dialing.hello_sent(address, ok)
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
        return self.room.target

    def next_due(self, now: float) -> float:
        """When `tick` next has work: a ping or gossip round, a dial, a peer's timeout, a fill
        from the passive view, a rejoin. The node sleeps until then (or until a message changes
        it): an idle node wakes a few times a second, not at every dial retry interval."""
        due = [self._next_ping_at, self._next_gossip_at, *(entry.next_at for entry in self.dialing.values())]
        if self.peers:
            due.append(min(peer.last_seen for peer in self.peers.values()) + self.settings.peer_timeout_s)
        elif self._bootstrap and not self.dialing.joining:
            due.append(now)  # alone: rejoin
        if self.passive and self.room.seeking():
            due.append(self.passive.earliest())
        if self.advertised and self.reachability.state != PUBLIC:
            due.append(self.dial_backs.next_ask_at)
        return max(now, min(due))

    def tick(self, now: float) -> list[Action]:
        """Time-driven work: evict the silent, ping the rest, retry dials, fill the active view
        from the passive one, gossip peers."""
        actions: list[Action] = []
        for peer in list(self.peers.values()):
            if now - peer.last_seen > self.settings.peer_timeout_s:
                actions += self._evict(peer, now, "timeout")
        if not self.peers and not self.dialing.joining:
            for address, key in self._bootstrap.items():  # alone: join again where we joined first
                self._dial_later(address, permanent=True, key=key, informant="bootstrap", now=now)
        ready = self.ready()
        if now >= self._next_ping_at and ready:
            # One nonce per round: one signed PING serves every peer, and each PONG times one.
            self._ping_nonce = self.rng.randint(0, _U64)
            self._ping_sent_at = now
            actions.append(Send(_addresses(ready), Ping(nonce=self._ping_nonce)))
        if now >= self._next_ping_at:
            self._next_ping_at = now + self.settings.ping_interval_s
        for entry in list(self.dialing.values()):
            if now >= entry.next_at:
                actions += self.dialing.step(entry, now, enough=len(self.peers) >= self.target)
        if self.passive and self.room.seeking():
            actions += self._fill(now)
        if now >= self._next_gossip_at:
            self._next_gossip_at = now + self.settings.exchange_interval_s
            if ready:
                chosen = self.rng.sample(ready, min(self.settings.gossip_fanout, len(ready)))
                actions.append(Send(_addresses(chosen), self._peers_body()))
        if self.advertised and self.reachability.state != PUBLIC and now >= self.dial_backs.next_ask_at:
            # Not known to be reachable where it says: the bootstrap entries and peers it reaches dial it back.
            targets = list(dict.fromkeys([*self._bootstrap, *_addresses(ready)]))
            nonces = [self.rng.randint(0, _U64) for _ in targets[: self.dial_backs.asks]]
            for ask in self.dial_backs.due(now, targets, port_of(self.advertised), nonces):
                actions.append(Send((ask.address,), DialMe(nonce=ask.nonce, port=ask.port)))
        return actions

    def goodbye(self) -> list[Action]:
        """What to send on shutdown."""
        return [Send(_addresses(self.peers.values()), Bye(reason="shutdown"))] if self.peers else []

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
        subnet = self._subnets.of_node(address, _source(informant))
        refusal = self.dialing.over_budget(address, informant) or self.room.no_room_for(
            subnet, now, newcomer=isinstance(informant, Direct)
        )
        if refusal is not None:
            self.counts[refusal] += 1
            self.passive.remember(hello, frame, informant, now, self.rng)
            return []
        entry = self._dial_later(address, permanent=False, key=hello.sender, informant=informant, now=now)
        entry.hello = (hello, frame)
        # Opens the connection; HELLO and challenge follow.
        return self.dialing.step(entry, now, enough=len(self.peers) >= self.target)

    def _admit(self, entry: Dialing, hello: Envelope, frame: bytes, *, seq: int, now: float) -> list[Action]:
        """`hello`'s key answered the challenge sent to `entry.address`: admit it there, or,
        with the table full, redirect it."""
        subnet = self._subnets.of_node(entry.address, _source(entry.informant))
        key = hello.sender
        refusal = self.room.no_room_for(subnet, now)
        full = len(self.peers) >= self.settings.max_peers  # then the subnet rule may displace (#14)
        surplus = None
        returning = key in self._redirected
        if refusal is None and not full and not (entry.permanent or entry.committed or self.room.welcome(returning)):
            surplus = self.room.surplus_peer(now) if returning else None
            refusal = "refused_full" if surplus is None else None
        if refusal == "refused_full":
            if entry.answered:
                return self._redirect(entry, hello, frame)
            entry.full = (hello, frame)  # it would refuse our sample before our answer: wait for its challenge
            return []
        if refusal is not None:
            self.counts[refusal] += 1
            return [] if entry.permanent else self.dialing.stop(entry)  # a bootstrap is retried
        # A full table makes room, if someone may leave it (`Room.displaceable`).
        victim = surplus if surplus is not None or not full else self.room.displaceable(subnet, now)
        actions = [] if victim is None else self._evict(victim, now, "displaced")
        peer = Peer.admitted(hello, frame, address=entry.address, subnet=subnet, now=now)
        self.peers[key] = peer
        self.counts["admitted"] += 1
        self._heard.pop(key, None)
        self.passive.forget(key)
        self.dialing.admitted(entry, key)
        actions.append(Admitted(key, seq, entry.address))
        if peer.peers_address is not None:
            actions.append(DialPeers(peer.address, peer.peers_address))
        if entry.answered:
            if entry.owed_pong is not None:  # its challenge, held back (no place was kept): answered now
                if not entry.hello_out:
                    actions.append(SendHello(entry.address))
                actions.append(Send((entry.address,), Pong(nonce=entry.owed_pong)))
            peer.admitted_us = True  # we answered its challenge: it admits us before our PEERS behind it
            actions.append(Send((peer.address,), self._peers_body()))
        return actions

    def _redirect(self, entry: Dialing, hello: Envelope, frame: bytes) -> list[Action]:
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
        # Relayed to later newcomers if verified there and dialable (a client node is not).
        dialable = hello.body.address == entry.address and not is_client_address(entry.address)
        self._redirected[key] = frame if dialable else None
        self._redirected.move_to_end(key)
        while len(self._redirected) > STRANGERS:
            self._redirected.popitem(last=False)
        self.dialing.drop(entry.address)
        actions: list[Action] = []
        if entry.owed_pong is not None:  # our answer first: only then does it take our sample
            actions += [SendHello(entry.address), Send((entry.address,), Pong(nonce=entry.owed_pong))]
        sample = self._peers_body(first=self.rng.sample(others, min(len(others), self.target)))
        actions += [Send((entry.address,), sample), Send((entry.address,), Bye(reason=FULL))]
        return actions + self.dialing.release(entry.address, flush=True)

    # --- internals -----------------------------------------------------------------------

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
            self.passive.remember(
                peer.hello_envelope, peer.hello, "demoted", now, self.rng, wait=self.settings.dial_retry_max_s
            )
        actions += self.dialing.release(peer.address, flush=why == "displaced")
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

    def _fill(self, now: float) -> list[Action]:
        """Below the target: verify addresses from the passive view, in random order, as far as
        the dial budgets allow (an entry over budget waits for a later tick)."""
        actions: list[Action] = []
        for key in self.passive.due(now, self.rng):
            if not self.room.seeking():
                break
            entry = self.passive[key]
            hello, address = entry.hello, entry.hello.body.address
            if now >= entry.expires_at or self.dialing.gave_up_on(hello):
                self.passive.forget(key)
                continue
            if address in self.dialing:
                continue
            if self.dialing.over_budget(address, entry.informant) or self.room.no_room_for(
                self._subnets.of(address), now
            ):
                continue
            self.passive.forget(key)
            self.counts["passive_dialled"] += 1
            actions += self._verify(hello, entry.frame, entry.informant, now)
        return actions

    def _dial_later(
        self, address: str, *, permanent: bool, key: bytes | None, informant: Informant, now: float
    ) -> Dialing:
        """Verify `address` (dialled at `now`), with a fresh challenge."""
        nonce = self.rng.randint(0, _U64)
        return self.dialing.add(address, permanent=permanent, key=key, informant=informant, nonce=nonce, now=now)

    def _peers_body(self, first: list[bytes] = ()) -> Peers:
        """Our own HELLO, the verified HELLOs `first`, then a random sample of our relayable peers'."""
        relayed = set(self.relayed_clients)
        others = [peer.hello for peer in self.peers.values() if peer.relayable or peer.key in relayed]
        head = ([self.own_hello] if self.own_hello is not None else []) + list(first)[: MAX_RELAYED_HELLOS - 1]
        sample = self.rng.sample(others, min(len(others), MAX_RELAYED_HELLOS - len(head)))
        return Peers(hellos=tuple(head + sample))


def _source(informant: Informant) -> str | None:
    """The host a HELLO's connection came from, where it came from its own key."""
    return informant.source if isinstance(informant, Direct) else None
