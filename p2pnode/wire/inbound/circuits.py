"""Client nodes reached through a relay (issue #46): the routes of a node to the client nodes it
cannot reach otherwise, wrapped around its own (`Replies` or `Dials`, routes.py).

A client node is reached through a relay R once this node knows R holds a place for it: R named
it in a PEERS (relays name the client nodes they hold places for), or a frame of the client's
came through R (RELAYED). Its frames then go to R sealed (the link: relay/link.py) as long as
the node's own routes have no connection to it; once they have one (the client dialled this
node), that connection is used. Only client addresses go through a relay: others are dialled.

A relay's word is only its word: one that names a client it does not reach would have this
node's frames for it go nowhere. So a way the client's own frames came (sealed by it, accepted:
no relay can forge or replay one) is not replaced by another relay's word, only by another way
its frames came, or once the relay it came through is no longer a peer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from protocol import Envelope, node_id
from protocol.messages import client_address, is_client_address

from ..transport import DROPPED
from ..zmqsetup import CLIENT
from .reader import RELAYED, Inbound
from .routes import Dials, Replies
from .supervisor import Ingress

__all__ = ["Circuits", "routes_for"]


class Link(Protocol):
    """The node's side of relays (relay/link.py)."""

    def send(self, client: bytes, relay: bytes, frame: bytes, tag: object = None) -> str:
        """`frame` sealed to `client`, through `relay`: SENT or DROPPED (`tag`: the node's
        (type, frame bytes, payload bytes) of it, if it has one)."""

    def reverse(self, client: bytes, relay: bytes) -> None:
        """Ask `relay` to have `client` dial this node."""


class Circuits:
    def __init__(self, base: Replies | Dials, link: Link, max_known: int) -> None:
        self.base, self.link, self.max_known = base, link, max_known
        # Client address -> (its key, the relay that reaches it), the least recently learned forgotten first.
        self.via: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()
        self.proven: set[str] = set()  # the client addresses whose route a frame of theirs came by

    @property
    def held(self):
        return self.base.held

    def learn(self, client: bytes, relay: bytes, *, proven: bool = False) -> None:
        """`relay` reaches `client`: its word (a PEERS), or `proven` (a frame of the client's came
        through it), which a relay's word does not replace."""
        address = client_address(client)
        if not proven and address in self.proven and self.via[address][1] != relay:
            return
        if proven:
            self.proven.add(address)
        self.via[address] = (client, relay)
        self.via.move_to_end(address)
        while len(self.via) > self.max_known:
            self.proven.discard(self.via.popitem(last=False)[0])

    def relay_gone(self, relay: bytes) -> None:
        """`relay` is no longer a peer: the ways through it prove nothing any more."""
        self.proven -= {address for address in self.proven if self.via[address][1] == relay}

    def seen(self, envelope: Envelope, socket: str, routing_id: bytes) -> None:
        """What the receive path tells routes (`Inbound.route_seen`): a frame through a relay
        teaches the way back; the others go to the node's own routes."""
        if socket == RELAYED:
            self.learn(envelope.sender, routing_id[:32], proven=True)
        elif isinstance(self.base, Replies):
            self.base.seen(envelope, socket, routing_id)

    def through_relay(self, address: str) -> bool:
        return address in self.via and not self.base._expects(address)

    def route(self, address: str) -> str:
        """How this node reaches `address` (for `status` and `doctor`): `relay:<node id>`, over
        the `connection` the client dialled to this node, or `dialled` by this node."""
        if self.through_relay(address):
            return f"relay:{node_id(self.via[address][1])}"
        return "connection" if isinstance(self.base, Replies) and self.base._expects(address) else "dialled"

    def owns(self, address: str) -> bool:
        return address in self.via or self.base.owns(address)

    def dial(self, address: str, key: bytes | None) -> None:
        """Nobody dials a client node: it is reached as it dialled, or through a relay, and a node
        that can be dialled asks the relay to have it dial (connection reversal)."""
        if not is_client_address(address):
            self.base.dial(address, key)
        elif isinstance(self.base, Replies) and self.through_relay(address):
            self.link.reverse(*self.via[address])

    def dial_peers(self, address: str, peers_address: str) -> None:
        if not self.through_relay(address):
            self.base.dial_peers(address, peers_address)

    def admitted(self, address: str) -> None:
        self.base.admitted(address)

    def hangup(self, address: str, flush: bool = False) -> None:
        self.base.hangup(address, flush)

    def send(self, address: str, frame: bytes, *, public: bool = False, tag: object = None) -> str:
        if not self.through_relay(address):
            return self.base.send(address, frame, public=public, tag=tag) if self.base.owns(address) else DROPPED
        return self.link.send(*self.via[address], frame, tag)

    def send_waiting(self) -> tuple[list[object], list[object]]:
        return self.base.send_waiting()


def routes_for(
    ingress: Mapping[str, Ingress],
    inbound: Inbound,
    config: Any,
    curve: bool,
    is_peer: Callable[[bytes], bool],
    link: Link,
) -> Circuits:
    """A client node's `Dials`, or `Replies` to client peers on a node that can be dialled, which
    learn their routes from what `inbound` reads (`config`: the node's, config/loading.py); both
    inside `Circuits`, which reach other client nodes through relays (`link`)."""
    public_bound, transport = config.limits.max_public_frame_bytes, config.transport
    if CLIENT in ingress:
        base = Dials(ingress[CLIENT], public_bound, curve, transport.connect_wait_s, transport.send_hwm)
    else:
        max_peers = config.discovery.max_peers
        base = Replies(ingress, public_bound, max_peers, is_peer, transport.connect_wait_s, transport.send_hwm)
    circuits = Circuits(base, link, max_known=4 * config.discovery.max_peers)
    inbound.route_seen = circuits.seen
    return circuits
