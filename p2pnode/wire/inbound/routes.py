"""Peers reached over connections the node holds instead of by dialling their address (issue
#46): what transport.py hands an address to when it is one of these (`Routes.owns`).

- `Replies`, on a node that can be dialled: a *client* peer (a node behind a NAT that announces
  a client address, protocol/messages.py `client_address`) is reached over the connections it
  dialled to this node's public and peers' sockets. Its route is the routing id its latest
  verified frame came with on each socket (`learn`: the node calls it only for frames signed by
  the key the client address belongs to, so nobody else can take the route over); frames go
  there as replies (`Ingress.reply`), the peers' socket first but for HELLO, as a DEALER's would.
- `Dials`, on a client node (`[node].client_mode`): every peer, through the client ingress, over
  the connections it dialled (`Ingress.connect`), one to a node's public socket and, once
  admitted, one to its peers' socket.

Neither blocks, as transport.py's sends never do: a frame whose connection is not up yet waits
for it (WAITING, `connect_wait_s`, as a DEALER's frame for a peers' socket still opening; sent
by `send_waiting`); one with no route coming, or one the ingress refuses, is DROPPED.
`open_inbound` starts a node's inbound sockets (or a client's one); circuits.py's `routes_for`
picks which of the two a node uses.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Protocol

from protocol import Envelope, MessageType
from protocol.curve import curve_public_from_ed25519
from protocol.messages import CLIENT_CAPABILITY, client_address, is_client_address

from ..transport import DROPPED, SENT, WAITING
from ..zmqsetup import CLIENT, PEERS, PUBLIC
from .supervisor import Ingress

__all__ = ["Replies", "Dials", "open_inbound"]


class _Holding:
    """Frames for a connection not up yet wait for it, as transport.py's do for a peers' socket
    still opening: each up to `wait_s` (`connect_wait_s`), `max_waiting` (`send_hwm`) in all,
    as (give up at, address, frame, public, tag), oldest first; `send_waiting` sends what can go
    now."""

    def __init__(self, wait_s: float, max_waiting: int) -> None:
        self.held: deque[tuple[float, str, bytes, bool, object]] = deque()
        self.wait_s, self.max_waiting = wait_s, max_waiting

    def _try(self, address: str, frame: bytes, public: bool) -> str | None:
        """SENT or DROPPED; None while the connection it needs is not up."""
        raise NotImplementedError

    def _expects(self, address: str) -> bool:
        """Whether a connection to `address` is coming (so a frame for it may wait)."""
        raise NotImplementedError

    def send(self, address: str, frame: bytes, *, public: bool = False, tag: object = None) -> str:
        outcome = self._try(address, frame, public)
        if outcome is not None:
            return outcome
        if len(self.held) >= self.max_waiting or not self.wait_s or not self._expects(address):
            return DROPPED
        self.held.append((time.monotonic() + self.wait_s, address, frame, public, tag))
        return WAITING

    def send_waiting(self) -> tuple[list[object], list[object]]:
        """The tags of the held frames sent now, and of those given up."""
        sent, given_up, kept, now = [], [], deque(), time.monotonic()
        for held in self.held:
            give_up_at, address, frame, public, tag = held
            outcome = self._try(address, frame, public) if self._expects(address) else DROPPED
            if outcome is None and give_up_at > now:
                kept.append(held)
            elif tag is not None:
                (sent if outcome is SENT else given_up).append(tag)
        self.held = kept
        return sent, given_up


class Replies(_Holding):
    def __init__(
        self,
        ingress: Mapping[str, Ingress],
        max_public_frame_bytes: int,
        max_strangers: int,
        is_peer: Callable[[bytes], bool],
        wait_s: float,
        max_waiting: int,
    ) -> None:
        super().__init__(wait_s, max_waiting)
        self.ingress, self.max_public_frame_bytes, self.is_peer = ingress, max_public_frame_bytes, is_peer
        # Client address -> socket -> routing id: peers' until they are hung up on; strangers'
        # (being verified) at most `max_strangers`, the least recently heard forgotten first.
        self.routes: dict[str, dict[str, bytes]] = {}
        self.strangers: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self.max_strangers = max_strangers

    def owns(self, address: str) -> bool:
        return is_client_address(address)

    def learn(self, address: str, socket: str, routing_id: bytes, *, peer: bool) -> None:
        """A frame signed by the key of client `address` came on `socket` with `routing_id`."""
        if peer:
            route = self.routes.setdefault(address, self.strangers.pop(address, {}))
        else:
            route = self.strangers.setdefault(address, {})
            self.strangers.move_to_end(address)
            while len(self.strangers) > self.max_strangers:
                self.strangers.popitem(last=False)
        route[socket] = routing_id

    def seen(self, envelope: Envelope, socket: str, routing_id: bytes) -> None:
        """An accepted frame of `envelope.sender` came on `socket` with `routing_id`: the route of
        a client node, if it is one (its HELLO said so, under its own key's address)."""
        address = client_address(envelope.sender)
        if self._expects(address) or _announces_client(envelope, address):
            self.learn(address, socket, routing_id, peer=self.is_peer(envelope.sender))

    def dial(self, address: str, key: bytes | None) -> None:
        """Nothing to open: the client dialled this node."""

    def dial_peers(self, address: str, peers_address: str) -> None:
        """Nothing to open: the client dials this node's peers' socket itself."""

    def admitted(self, address: str) -> None:
        if address in self.strangers:
            self.routes.setdefault(address, {}).update(self.strangers.pop(address))

    def hangup(self, address: str, flush: bool = False) -> None:
        self.routes.pop(address, None)
        self.strangers.pop(address, None)

    def _expects(self, address: str) -> bool:
        return address in self.routes or address in self.strangers

    def _try(self, address: str, frame: bytes, public: bool) -> str | None:
        """The peers' socket first (a large frame waits for the client's connection there), the
        public one for what fits."""
        route = self.routes.get(address) or self.strangers.get(address) or {}
        for socket in (PUBLIC,) if public else (PEERS, PUBLIC):
            routing_id = route.get(socket)
            if routing_id is None or (socket == PUBLIC and len(frame) > self.max_public_frame_bytes):
                continue
            return SENT if self.ingress[socket].reply(routing_id, frame) else DROPPED
        return None


class Dials(_Holding):
    def __init__(
        self, client: Ingress, max_public_frame_bytes: int, curve: bool, wait_s: float, max_waiting: int
    ) -> None:
        super().__init__(wait_s, max_waiting)
        self.client, self.max_public_frame_bytes, self.curve = client, max_public_frame_bytes, curve
        self.peers: dict[str, str] = {}  # a node's public address -> its peers' socket's address
        self.keys: dict[str, bytes | None] = {}  # a node's public address -> the key expected there

    def owns(self, address: str) -> bool:
        return True

    def dial(self, address: str, key: bytes | None) -> None:
        self.client.connect(address, _alias(address), self._server_key(key))
        self.keys[address] = key

    def dial_peers(self, address: str, peers_address: str) -> None:
        if self.peers.get(address) == peers_address:
            return
        if address in self.peers:
            self.client.disconnect(self.peers.pop(address))
        self.peers[address] = peers_address
        self.client.connect(peers_address, _alias(peers_address), self._server_key(self.keys.get(address)))

    def admitted(self, address: str) -> None:
        """Its connections are this node's dials, kept until hung up."""

    def hangup(self, address: str, flush: bool = False) -> None:
        for endpoint in (self.peers.pop(address, None), address):
            if endpoint is not None:
                self.client.disconnect(endpoint)
        self.keys.pop(address, None)

    def _expects(self, address: str) -> bool:
        return address in self.keys

    def _try(self, address: str, frame: bytes, public: bool) -> str | None:
        """Over the connection to the peers' socket of `address` once it is up (but a HELLO),
        else to its public socket if the frame is within that bound."""
        peers = None if public else self.peers.get(address)
        use_peers = peers is not None and (peers in self.client.connected or len(frame) > self.max_public_frame_bytes)
        endpoint = peers if use_peers else address
        if endpoint not in self.client.connected:
            return None
        return SENT if self.client.send(_alias(endpoint), frame) else DROPPED

    def _server_key(self, key: bytes | None) -> bytes | None:
        return curve_public_from_ed25519(key) if self.curve and key is not None else None


def _announces_client(envelope: Envelope, address: str) -> bool:
    if envelope.type is not MessageType.HELLO:
        return False
    return envelope.body.address == address and CLIENT_CAPABILITY in envelope.body.capabilities


def _alias(endpoint: str) -> bytes:
    """The routing id a client ingress names its connection to `endpoint` by (5 bytes or more:
    ZeroMQ's own routing ids start with a zero byte, these never do)."""
    return b"c" + hashlib.sha256(endpoint.encode()).digest()[:8]


class Listening(Protocol):
    """What `open_inbound` reads of the [node] settings (config/sections.py NodeSettings)."""

    listen: str | None
    peer_listen: str | None
    advertise: str | None
    peer_advertise_port: int | None


async def open_inbound(
    ingress: Mapping[str, Ingress], public_key: bytes, node: Listening
) -> tuple[str, int | None, str]:
    """Start the node's inbound sockets as its `[node]` settings say: PUBLIC and PEERS bound, or
    a client node's CLIENT (binding nothing). Returns the address its HELLO gives, the peers'
    port it announces and, for the log, where it listens. Raises BindError."""
    if CLIENT in ingress:
        await ingress[CLIENT].start(None)
        return client_address(public_key), None, "in client mode: reached over the connections it dials"
    endpoint = await ingress[PUBLIC].start(node.listen)
    peers_endpoint = await ingress[PEERS].start(node.peer_listen or f"{endpoint.rsplit(':', 1)[0]}:0")
    peer_port = node.peer_advertise_port or int(peers_endpoint.rsplit(":", 1)[1])
    return node.advertise or endpoint, peer_port, f"listening on {endpoint} (peers' socket {peers_endpoint})"
