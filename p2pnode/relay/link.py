"""The node's side of relays (issue #46). It seals its frames for a client node it reaches through
a relay and hands them to the relay in a RELAY; what a relay hands it in a RELAYED goes the receive
path's way (`Inbound.deliver_relayed`). Frames stay signed end to end, and a relay reads none
(protocol/sealing.py; docs/protocol.md, "Relays").

Connection reversal: a node others can dial that wants a client node it hears of only through a
relay asks the relay (REVERSE, with its own signed HELLO) to have the client dial it, and the
client, told by its relay, dials it: their traffic is then direct. Until then it goes through
the relay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from protocol import Body, Decoder, Envelope, MessageType, ProtocolError, Relay, Reverse, Sealing
from protocol.messages import RELAY_CAPABILITY, is_client_address

from ..wire.inbound.circuits import Circuits
from ..wire.transport import DROPPED, SENT

if TYPE_CHECKING:
    from ..discovery.membership_actions import MembershipActions
    from ..discovery.peer import Peer
    from ..discovery.peers import Membership
    from ..wire.inbound.reader import Handler, Inbound
    from ..wire.transport import Transport
    from .service import RelayService

__all__ = ["RelayLink"]

REVERSE_UNEXPECTED = "reverse_unexpected"  # a REVERSE for this node from a peer that relays for nobody
REVERSE_BAD_HELLO = "reverse_bad_hello"  # a REVERSE whose HELLO is not its sender's


class LinkedNode(Protocol):
    """What the link uses of its node (p2pnode/node.py)."""

    encoder: object
    transport: Transport
    inbound: Inbound
    relay: RelayService
    membership: Membership | None
    membership_actions: MembershipActions | None
    clock_us: Callable[[], int]

    def send(self, addresses: tuple[str, ...], body: Body) -> int: ...


class RelayLink:
    def __init__(self, node: LinkedNode, next_seq: Callable[[Body], int | None]) -> None:
        self.node, self.next_seq, self.counts = node, next_seq, node.relay.counts
        encoder = node.encoder
        self.own_key = encoder.identity.public_key
        self.sealing = Sealing(encoder.identity, encoder.network_id)
        self._frames = Decoder(encoder.network_id, encoder.limits)  # reads headers, this node's frames too
        self.circuits: Circuits | None = None  # set once the node's routes are built

    def send(self, client: bytes, relay: bytes, frame: bytes, tag: object = None) -> str:
        """`frame`, one of this node's, sealed to `client` and sent in a RELAY to peer `relay`
        (`tag`: the node's (type, frame bytes, payload bytes) of it, where it counts them)."""
        peer = self.node.membership.peers.get(relay)
        if peer is None:
            self.counts["relay_out_no_relay"] += 1
            if self.circuits is not None:
                self.circuits.relay_gone(relay)  # another relay's word may show the way now
            return DROPPED
        try:
            header = self._frames.peek(frame)
            body = Relay(target=client, sealed=self.sealing.seal(client, header.seq, frame))
            seq = self.next_seq(body)
            if seq is None:
                return DROPPED
            # Round 0: the relay does not learn this node's rounds.
            outer = self.node.encoder.encode(body, seq=seq, timestamp_us=self.node.clock_us(), round=0)
        except ProtocolError:  # larger than a RELAY carries
            self.counts["relay_out_too_large"] += 1
            return DROPPED
        if self.node.transport.send(peer.address, outer) is DROPPED:
            self.counts["relay_out_dropped"] += 1
            return DROPPED
        # What the relay's hop costs: the RELAY's bytes against the frame's own and its payload's
        # (the tensors inside), learning frames apart.
        kind = "learning" if header.type.is_learning else "other"
        self.counts["relay_out_frames"] += 1
        self.counts[f"relay_out_{kind}_bytes"] += len(outer)
        self.counts[f"relay_out_{kind}_frame_bytes"] += len(frame)
        if isinstance(tag, tuple):
            self.counts[f"relay_out_{kind}_payload_bytes"] += tag[2]
        return SENT

    def reverse(self, client: bytes, relay: bytes) -> None:
        """Ask `relay` to have `client` dial this node (a node others can dial: `Circuits.dial`)."""
        membership = self.node.membership
        peer = membership.peers.get(relay)
        if peer is not None and membership.own_hello is not None:
            self.node.send((peer.address,), Reverse(target=client, hello=membership.own_hello))
            self.counts["reversals_asked"] += 1

    def announced(self, informant: bytes, relayed: list[tuple[Envelope, bytes]]) -> None:
        """A peer's PEERS named client nodes: a relay names those it holds a place for, so it
        reaches them (others' word for it is not taken: they could route us into nowhere; nor a
        relay's against a way the client's own frames came: `Circuits.learn`)."""
        peer = self.node.membership.peers.get(informant)
        if self.circuits is None or peer is None or RELAY_CAPABILITY not in peer.capabilities:
            return
        for hello, _ in relayed:
            if is_client_address(hello.body.address) and hello.sender != informant:
                self.circuits.learn(hello.sender, informant)

    async def receive(self, envelope: Envelope, handle: Handler, now: float) -> str | None:
        """A relaying frame (protocol RELAY_TYPES) from an admitted peer: a RELAYED's frame goes
        the receive path's way, as if direct; a REVERSE is passed on or acted on; the others are
        the relay service's. Returns the refusal to count, if any."""
        node = self.node
        peers = node.membership.peers
        if envelope.type is MessageType.RELAYED:
            await node.inbound.deliver_relayed(envelope.sender, envelope.body, handle)
            return None
        if envelope.type is MessageType.REVERSE:
            return await self._reverse(envelope, peers[envelope.sender], now)
        refusal, sends = node.relay.on_message(envelope, peers[envelope.sender], peers, now)
        self._send(sends)
        return refusal

    def tick(self, now: float) -> None:
        """The relay service's timed work: places expired, a client's RESERVEs due; and the
        client nodes this relay holds places for, which its PEERS names."""
        membership = self.node.membership
        membership.relayed_clients = self.node.relay.holders(now)
        self._send(self.node.relay.tick(now, membership.peers, membership.ready()))

    def _send(self, sends: list[tuple[str, Body]]) -> None:
        for address, body in sends:
            self.node.send((address,), body)

    async def _reverse(self, envelope: Envelope, peer: Peer, now: float) -> str | None:
        """REVERSE: at the relay, passed on to its client; at the client, the HELLO inside is
        taken as its relay's word for the node that asked, which it then dials."""
        body, node = envelope.body, self.node
        if body.target != self.own_key:  # at the relay: pass it on to its client
            try:
                header = self._frames.peek(body.hello)
            except ProtocolError:
                return REVERSE_BAD_HELLO
            if header.sender != peer.key or header.type is not MessageType.HELLO:
                return REVERSE_BAD_HELLO
            refusal, sends = node.relay.reversal(peer, body.target, body.hello, node.membership.peers, now)
            self._send(sends)
            return refusal
        if RELAY_CAPABILITY not in peer.capabilities:
            return REVERSE_UNEXPECTED
        for hello, frame in await node.inbound.verify_relayed((body.hello,), set(), counted_as="reverse"):
            actions = node.membership.on_announced(hello, frame, now, node.clock_us(), informant=peer.key)
            node.membership_actions.carry_out(actions)  # it dials the node that asked, as one a peer named
        return None
