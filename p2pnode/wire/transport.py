"""ZeroMQ sockets of one node: outbound DEALERs per peer address here, two inbound ROUTERs in
the ingress process (inbound/supervisor.py).

Frames flow one way on each connection: a node sends only on its DEALERs and receives only on
its ROUTERs, so each pair of peers holds its own connections and neither side ever waits on the
other. Sends never wait either: an outbound socket with IMMEDIATE=1 refuses frames while it is
not connected or while its queue (SNDHWM) is full, and the frame is dropped and counted. The
round protocol tolerates loss (deadlines), which a blocked event loop would not. One exception:
a peer's first large frames (a MODEL) are often sent a few milliseconds after its admission,
while the connection to its peers' socket is still in its TCP and CURVE handshakes; those wait
for it, bounded in time and count (`connect_wait_s`, `send_hwm`), instead of costing the peer
that round's payload.

Two inbound sockets, because ZeroMQ reads a whole frame before the node sees a byte of it and
its size bound (ZMQ_MAXMSGSIZE) is per socket: the *public* socket (`[node].listen`), where
strangers connect and handshakes happen, takes frames up to `max_public_frame_bytes` only; the
*peers'* socket (`[node].peer_listen`, its port announced in HELLO) takes frames up to
`max_frame_bytes`, and with CURVE only from admitted peers (zap.py). Every frame to an admitted
peer goes to its peers' socket, but HELLO and, while that connection is not up or is full, frames
within the public bound: so the public socket carries strangers' frames, which the node reads no
faster than the strangers' budget (inbound/reader.py), and a flood there backs up into the flooder's
own queues without delaying what peers send.

With CURVE (`[security].curve`) every connection is encrypted and authenticated: the ROUTERs are
CURVE servers with this node's derived X25519 secret, and each DEALER a CURVE client whose
server key is derived from the Ed25519 key expected at the address, so only that key's holder
completes the handshake; a dial without a key is refused (no plaintext fallback). In both modes
the ROUTERs ask the ZAP handler (zap.py) about every inbound connection.

The ROUTERs run in a child process of their own, so that libzmq's abort on a crafted connection
(inbound/supervisor.py) ends that process, not the node. All socket options are set before bind/connect
(ZMQ_MAXMSGSIZE set later does not apply). Every call happens on the trio thread: ZeroMQ sockets
are not thread-safe.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Protocol

import trio
import zmq

from protocol.curve import curve_public_from_ed25519

from ..wire.settings import TransportSettings
from .zmqsetup import read_events, set_liveness, unwatch, watch_handshakes

__all__ = ["Transport", "TransportError", "MissingKey", "Routes", "SENT", "WAITING", "DROPPED"]

log = logging.getLogger("p2pnode.transport")

# DEALERs never receive: a peer that pushes frames at one is cut off at this size, and at most
# one such frame is held.
_OUTBOUND_MAX_INBOUND_BYTES = 1024
# With CURVE, ZMQ_MAXMSGSIZE bounds the encrypted MESSAGE command: the frame plus its box (33
# bytes, and the command's own header). Without this room a frame of exactly the bound is cut.
CURVE_SLACK = 64


# What `Transport.send` did with a frame.
SENT = "sent"  # queued on a connection
WAITING = "waiting"  # held for a peers' connection still opening (`send_waiting` says what became of it)
DROPPED = "dropped"  # no connection took it


class Routes(Protocol):
    """What reaches the addresses it `owns` over connections the node holds (inbound/routes.py)."""

    def owns(self, address: str) -> bool: ...
    def dial(self, address: str, key: bytes | None) -> None: ...
    def dial_peers(self, address: str, peers_address: str) -> None: ...
    def admitted(self, address: str) -> None: ...
    def hangup(self, address: str, flush: bool = False) -> None: ...
    def send(self, address: str, frame: bytes, *, public: bool = False, tag: object = None) -> str: ...
    def send_waiting(self) -> tuple[list[object], list[object]]: ...

    held: Sized  # frames waiting for a connection, sent by `send_waiting` once it is up


class TransportError(Exception):
    """A socket could not be set up (bad or busy address); the message says which and why."""


class MissingKey(TransportError):
    """With CURVE, a dial must name the key expected at the address: the server key comes from it."""


@dataclass
class Redial:
    """When an outbound connection that takes no frame is opened anew: `after_s` after it was
    opened or last took one, the wait doubling after each reopening that did not help, up to
    `max_s`, and back to `first_s` once it takes a frame. libzmq reconnects a connection that
    broke by itself, but never one the other side's ZAP handler refused or whose handshake
    failed: without this, a node refused once (a cap, a ban, a peer that had not admitted it
    yet) never tried again."""

    first_s: float
    max_s: float
    took_at: float = 0.0  # when the connection was opened or last took a frame
    after_s: float = 0.0
    reopened: int = 0  # since it last took a frame

    def __post_init__(self) -> None:
        self.after_s = self.first_s

    def opened(self, now: float) -> None:
        self.took_at = now

    def took(self, now: float) -> None:
        self.took_at, self.after_s, self.reopened = now, self.first_s, 0

    def due(self, now: float) -> bool:
        """Whether to open the connection anew now (it was refusing frames); if so, the next
        wait is twice as long."""
        if now - self.took_at < self.after_s:
            return False
        self.took_at, self.after_s, self.reopened = now, min(self.max_s, 2 * self.after_s), self.reopened + 1
        return True


@dataclass
class _Outbound:
    socket: zmq.Socket  # to the public socket at the address
    key: bytes | None  # the key expected there
    redial: Redial  # of `socket`
    peers_redial: Redial  # of `peers`
    peers: zmq.Socket | None = None  # to its peers' socket, once it is an admitted peer
    peers_address: str | None = None
    peers_up: bool = False  # `peers` took a frame since it was opened
    # Frames for `peers` while it is opening, as (give up at, frame, tag), oldest first.
    waiting: deque[tuple[float, bytes, object]] = field(default_factory=deque)
    monitor: zmq.Socket | None = None  # a watched dial's handshakes (`dial(watch=True)`)
    handshakes: Counter[str] = field(default_factory=Counter)  # HANDSHAKE_OUTCOMES, since the dial


# A watched dial's handshake outcomes: the other side's ZAP handler refused this node (an
# allowlist, a connection cap), or the handshake failed otherwise (with CURVE: another key at
# that address, or a node without CURVE).
HANDSHAKE_OUTCOMES = {
    zmq.EVENT_HANDSHAKE_SUCCEEDED: "succeeded",
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "refused",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "failed",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "failed",
}


class Transport:
    def __init__(
        self,
        settings: TransportSettings,
        max_frame_bytes: int,
        curve: tuple[bytes, bytes] | None = None,
        max_public_frame_bytes: int | None = None,
    ) -> None:
        """`curve`: this node's X25519 (secret, public) key pair (Identity.curve_keypair) to
        encrypt every connection with; None: plaintext. `max_public_frame_bytes`: the bound of
        the public socket at the other end (default `max_frame_bytes`)."""
        self.settings = settings
        self.max_frame_bytes = max_frame_bytes
        self.max_public_frame_bytes = max_public_frame_bytes or max_frame_bytes
        self.curve = curve
        self.context: zmq.Context | None = None  # created on first use: nothing to clean up before
        self.outbound: dict[str, _Outbound] = {}  # public address -> its DEALERs
        self.reopened = 0  # connections opened anew for refusing every frame (`Redial`), in all
        # Tags of held frames (`send`: WAITING) sent, and given up, since `send_waiting` last told.
        self._waited_sent: list[object] = []
        self._given_up: list[object] = []
        self._once: deque[tuple[float, zmq.Socket]] = deque()  # `send_once`'s sockets, oldest first
        # Addresses reached over connections the node holds, not by dialling them (set by the
        # node: inbound/routes.py): whatever it `owns` goes there.
        self.routes: Routes | None = None

    def _context(self) -> zmq.Context:
        if self.context is None:
            self.context = zmq.Context(io_threads=1)
        return self.context

    def dial(self, address: str, key: bytes | None = None, *, watch: bool = False) -> None:
        """Open the outbound socket to `address`, where the Ed25519 `key` is expected, if not
        open yet (with another key: reopened); ZeroMQ connects and reconnects in the background
        (RECONNECT_IVL doubling up to RECONNECT_IVL_MAX). With CURVE, `key` is required.
        `watch`: count its handshakes' outcomes (`handshakes`), for a bootstrap entry."""
        if self._routed(address):
            return self.routes.dial(address, key)
        entry = self.outbound.get(address)
        if entry is not None:
            if self.curve is None or entry.key == key:
                return
            self.hangup(address)  # another node is expected there now: another server key
        now, s = time.monotonic(), self.settings
        entry = _Outbound(
            self._connect(address, key), key, Redial(s.redial_s, s.redial_max_s), Redial(s.redial_s, s.redial_max_s)
        )
        entry.redial.opened(now)
        self.outbound[address] = entry
        if watch:
            self._watch(address, entry)

    def _watch(self, address: str, entry: _Outbound) -> None:
        try:
            entry.monitor = watch_handshakes(self._context(), entry.socket)
        except zmq.ZMQError as exc:  # a diagnostic only: the dial goes on unwatched
            log.warning("cannot watch the handshakes of the dial to %s: %s", address, exc)

    def _reopen(self, address: str, entry: _Outbound) -> None:
        """The connection to `address`'s public socket opened anew (`Redial`), still watched if
        it was; its handshakes' totals go on."""
        try:
            socket = self._connect(address, entry.key)
        except TransportError as exc:
            log.warning("%s", exc)
            return
        watched = entry.monitor is not None
        if watched:
            self.handshakes()  # what the old connection's monitor holds is counted first
            unwatch(entry.socket, entry.monitor)
            entry.monitor = None
        entry.socket.close(linger=0)
        entry.socket = socket
        self.reopened += 1
        if watched:
            self._watch(address, entry)

    def handshakes(self) -> dict[str, Counter[str]]:
        """The watched dials' handshake outcomes since the last call, by address; read at least
        every few seconds (libzmq's I/O thread waits on a full monitor queue). Each entry keeps
        its totals since the dial in `handshakes_with`."""
        new: dict[str, Counter[str]] = {}
        for address, entry in self.outbound.items():
            if entry.monitor is not None:
                outcomes = Counter(HANDSHAKE_OUTCOMES.get(event, "other") for event in read_events(entry.monitor))
                if outcomes:
                    entry.handshakes.update(outcomes)
                    new[address] = outcomes
        return new

    def handshakes_with(self, address: str) -> Counter[str]:
        """The watched dial to `address`: its handshakes' outcomes since it was dialled."""
        entry = self.outbound.get(address)
        return Counter() if entry is None else Counter(entry.handshakes)

    def dial_peers(self, address: str, peers_address: str) -> None:
        """Also open the outbound socket to the peers' socket of the admitted peer at `address`
        (dialled before), for frames larger than the public bound."""
        if self._routed(address):
            return self.routes.dial_peers(address, peers_address)
        entry = self.outbound.get(address)
        if entry is None or entry.peers_address == peers_address:
            return
        self._open_peers(entry, peers_address)

    def _open_peers(self, entry: _Outbound, peers_address: str) -> None:
        if entry.peers is not None:
            entry.peers.close(linger=0)
            entry.peers = entry.peers_address = None
        entry.peers = self._connect(peers_address, entry.key)
        entry.peers_address, entry.peers_up = peers_address, False
        entry.peers_redial.opened(time.monotonic())

    def _connect(self, address: str, key: bytes | None, *, once: bool = False) -> zmq.Socket:
        """A DEALER connecting to `address`; `once`: for one frame (`send_once`), queued before
        the connection is up and never reconnected."""
        s = self.settings
        server_key = None
        if self.curve is not None:
            if key is None:
                raise MissingKey(f"not dialling {address}: CURVE needs the key expected there")
            try:
                server_key = curve_public_from_ed25519(key)
            except ValueError as exc:
                raise TransportError(f"cannot dial {address}: {exc}") from None
        socket = self._context().socket(zmq.DEALER)
        socket.setsockopt(zmq.SNDHWM, s.send_hwm)
        socket.setsockopt(zmq.IMMEDIATE, 0 if once else 1)
        socket.setsockopt(zmq.LINGER, s.linger_ms)
        socket.setsockopt(zmq.RECONNECT_IVL, -1 if once else s.reconnect_ivl_ms)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, s.reconnect_ivl_max_ms)
        socket.setsockopt(zmq.RCVHWM, 1)
        socket.setsockopt(zmq.MAXMSGSIZE, _OUTBOUND_MAX_INBOUND_BYTES)
        set_liveness(socket, s.handshake_ivl_ms, s.keepalive_s)
        if server_key is not None:
            socket.setsockopt(zmq.CURVE_SECRETKEY, self.curve[0])
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self.curve[1])
            socket.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        try:
            socket.connect(address)
        except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
            socket.close(linger=0)
            raise TransportError(f"cannot connect to {address}: {exc.strerror}") from None
        return socket

    def send_once(self, address: str, key: bytes | None, frame: bytes, within_s: float) -> None:
        """`frame` to `address` on a connection of its own: libzmq connects and sends it in the
        background, and the socket is closed `within_s` later, the frame sent or not (a
        dial-back: whether it gets there is what the other side learns). Queued before the
        connection is up (IMMEDIATE=0), unlike every other outbound socket's frames; with CURVE,
        only `key`'s holder can take it. Closing the node closes these at once."""
        if self._routed(address):
            return  # nobody dials a client node: the dial-back is what it asks of the dialled
        now = time.monotonic()
        self.close_expired(now)
        socket = self._connect(address, key, once=True)  # one try: a closed port is an answer too
        try:
            socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            pass  # cannot be: an empty queue takes one frame
        self._once.append((now + within_s, socket))

    def close_expired(self, now: float) -> None:
        """Close `send_once`'s sockets whose time is up (the node calls this as it maintains)."""
        while self._once and self._once[0][0] <= now:
            self._once.popleft()[1].close(linger=0)

    def outbound_socket(self, address: str) -> zmq.Socket | None:
        """The socket frames for `address` go on first (its peers' socket once there is one),
        None if there is none."""
        entry = self.outbound.get(address)
        if entry is None:
            return None
        return entry.peers if entry.peers is not None else entry.socket

    def admitted(self, address: str) -> None:
        """`address` is a peer's now: a route to it over a connection it dialled is kept as a
        peer's, no longer among the strangers' (which the least recently heard leave first)."""
        if self._routed(address):
            self.routes.admitted(address)

    def hangup(self, address: str, flush: bool = False) -> None:
        """Close the connections to `address`; with `flush`, what is queued on them (a BYE)
        still goes out within `linger_ms`, from ZeroMQ's I/O thread."""
        if self._routed(address):
            return self.routes.hangup(address, flush)
        entry = self.outbound.pop(address, None)
        if entry is not None:
            for _, _, tag in entry.waiting:
                _report(self._given_up, tag)
            if entry.monitor is not None:
                unwatch(entry.socket, entry.monitor)
            linger = self.settings.linger_ms if flush else 0
            entry.socket.close(linger=linger)
            if entry.peers is not None:
                entry.peers.close(linger=linger)

    def send(self, address: str, frame: bytes, *, public: bool = False, tag: object = None) -> str:
        """Queue `frame` for `address` without waiting: SENT, WAITING or DROPPED. It goes on the
        peers' socket of an admitted peer, unless `public` (a HELLO: the one frame a node that
        dropped this one from its table still reads from it) or that connection refuses it
        (not up yet, or full), when a frame within the public bound goes on the public one. A
        larger frame that the peers' connection refuses because it is still opening waits for
        it (`connect_wait_s`; `send_waiting` reports it with `tag`, unless None); one it refuses
        full is dropped."""
        if self._routed(address):
            return self.routes.send(address, frame, public=public, tag=tag)
        entry = self.outbound.get(address)
        if entry is None:
            return DROPPED
        now = time.monotonic()
        if entry.peers is not None and not public:
            self._send_waiting(entry, now)  # in order: what waits goes first
            if not entry.waiting and self._to_peers(entry, frame):
                return SENT
            self._revive_peers(entry)
            if len(frame) > self.max_public_frame_bytes:
                return self._wait(entry, frame, tag)
        try:
            entry.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            if entry.redial.due(now):
                self._reopen(address, entry)
            return DROPPED
        entry.redial.took(now)
        return SENT

    def _routed(self, address: str) -> bool:
        return self.routes is not None and self.routes.owns(address)

    def _to_peers(self, entry: _Outbound, frame: bytes) -> bool:
        try:
            entry.peers.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected, or the peer's queue is full
            return False
        entry.peers_redial.took(time.monotonic())
        entry.peers_up = True
        return True

    def _wait(self, entry: _Outbound, frame: bytes, tag: object) -> str:
        wait_s = self.settings.connect_wait_s
        if entry.peers_up or not wait_s or len(entry.waiting) >= self.settings.send_hwm:
            return DROPPED
        entry.waiting.append((time.monotonic() + wait_s, frame, tag))
        return WAITING

    @property
    def waiting(self) -> int:
        """Frames held for peers' connections still opening."""
        routed = 0 if self.routes is None else len(self.routes.held)  # a client node's wait there
        return routed + sum(len(entry.waiting) for entry in self.outbound.values())

    def send_waiting(self) -> tuple[list[object], list[object]]:
        """Send the frames held for connections that are up now; returns the tags of the held
        frames sent since the last call and of those given up (they waited `connect_wait_s`, or
        their peer was hung up on)."""
        now = time.monotonic()
        for entry in self.outbound.values():
            self._send_waiting(entry, now)
            if entry.waiting:
                self._revive_peers(entry)
        (sent, self._waited_sent), (given_up, self._given_up) = (self._waited_sent, []), (self._given_up, [])
        if self.routes is not None:
            routed_sent, routed_given_up = self.routes.send_waiting()
            sent, given_up = sent + routed_sent, given_up + routed_given_up
        return sent, given_up

    def _send_waiting(self, entry: _Outbound, now: float) -> None:
        while entry.waiting and self._to_peers(entry, entry.waiting[0][1]):
            _report(self._waited_sent, entry.waiting.popleft()[2])
        while entry.waiting and entry.waiting[0][0] <= now:
            _report(self._given_up, entry.waiting.popleft()[2])

    def _revive_peers(self, entry: _Outbound) -> None:
        """The connection to a peers' socket that takes no frame is opened anew (`Redial`): the
        peer's ZAP handler may have refused it a moment before it admitted this node, or its
        ingress process restarted."""
        if entry.peers_address is not None and entry.peers_redial.due(time.monotonic()):
            self.reopened += 1
            self._open_peers(entry, entry.peers_address)

    async def close(self) -> None:
        """Close every socket; outbound frames already queued (a BYE) get up to linger_ms, but
        a dial-back's (`send_once`), which is not worth waiting for."""
        self.close_expired(math.inf)
        for address in list(self.outbound):
            entry = self.outbound.pop(address)
            if entry.monitor is not None:
                unwatch(entry.socket, entry.monitor)
            for socket in (entry.socket, entry.peers):
                if socket is not None:
                    socket.close()  # keeps each socket's LINGER
        if self.context is not None:
            with trio.CancelScope(shield=True):
                # term() returns once queued frames are out or LINGER expired: bounded by linger_ms.
                await trio.to_thread.run_sync(self.context.term)


def _report(tags: list[object], tag: object) -> None:
    """A held frame's tag, for `send_waiting` to report; None (an untracked frame) is not."""
    if tag is not None:
        tags.append(tag)
