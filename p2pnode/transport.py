"""ZeroMQ sockets of one node: an inbound ROUTER, and one outbound DEALER per peer address.

Frames flow one way on each connection: a node sends only on its DEALERs and receives only on
its ROUTER, so each pair of peers holds two TCP connections and neither side ever waits on the
other. Sends never wait either: an outbound socket with IMMEDIATE=1 refuses frames while it is
not connected or while its queue (SNDHWM) is full, and the frame is dropped and counted. The
round protocol tolerates loss (deadlines, re-publishing), which a blocked event loop would not.

With CURVE (`[security].curve`) every connection is encrypted and authenticated: the ROUTER is
a CURVE server with this node's derived X25519 secret, and each DEALER a CURVE client whose
server key is derived from the Ed25519 key expected at the address, so only that key's holder
completes the handshake; a dial without a key is refused (no plaintext fallback). In both modes
the ROUTER asks the ZAP handler (zap.py) about every inbound connection.

All socket options are set before bind/connect (ZMQ_MAXMSGSIZE set later does not apply). Every
call happens on the trio thread: ZeroMQ sockets are not thread-safe.
"""

from __future__ import annotations

import trio
import zmq

from protocol.curve import curve_public_from_ed25519

from .config import TransportSettings
from .zap import close_zap, open_zap
from .zmqtrio import receive_batch

__all__ = ["Transport", "TransportError", "MissingKey"]

# DEALERs never receive: a peer that pushes frames at one is cut off at this size, and at most
# one such frame is held.
_OUTBOUND_MAX_INBOUND_BYTES = 1024


class TransportError(Exception):
    """A socket could not be set up (bad or busy address); the message says which and why."""


class MissingKey(TransportError):
    """With CURVE, a dial must name the key expected at the address: the server key comes from it."""


class Transport:
    def __init__(
        self, settings: TransportSettings, max_frame_bytes: int, curve: tuple[bytes, bytes] | None = None
    ) -> None:
        """`curve`: this node's X25519 (secret, public) key pair (Identity.curve_keypair) to
        encrypt every connection with; None: plaintext."""
        self.settings = settings
        self.max_frame_bytes = max_frame_bytes
        self.curve = curve
        self.context: zmq.Context | None = None  # created on first use: nothing to clean up before
        self.inbound: zmq.Socket | None = None
        self.zap: zmq.Socket | None = None  # the ZAP handler's socket and the ROUTER's monitor (zap.py)
        self.monitor: zmq.Socket | None = None
        self.outbound: dict[str, tuple[zmq.Socket, bytes | None]] = {}  # address -> (DEALER, key expected)
        self.endpoint: str | None = None
        # What the inbound socket delivered so far, routing ids aside (parts, their bytes):
        # buffers.py subtracts it from what arrived to estimate what libzmq holds.
        self.read_frames = 0
        self.read_bytes = 0

    def _context(self) -> zmq.Context:
        if self.context is None:
            self.context = zmq.Context(io_threads=1)
        return self.context

    def _heartbeats(self, socket: zmq.Socket) -> None:
        s = self.settings
        socket.setsockopt(zmq.HEARTBEAT_IVL, s.heartbeat_ivl_ms)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, s.heartbeat_timeout_ms)
        socket.setsockopt(zmq.HEARTBEAT_TTL, s.heartbeat_timeout_ms)
        socket.setsockopt(zmq.HANDSHAKE_IVL, s.handshake_ivl_ms)

    def bind(self, endpoint: str) -> str:
        """Open the inbound socket; returns the endpoint actually bound (port 0 resolved)."""
        socket = self._context().socket(zmq.ROUTER)
        socket.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        socket.setsockopt(zmq.RCVHWM, self.settings.recv_hwm)
        socket.setsockopt(zmq.SNDHWM, 1)  # never sends
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # were it to send, unknown peers raise, not vanish
        socket.setsockopt(zmq.LINGER, 0)
        self._heartbeats(socket)
        if self.curve is not None:
            socket.setsockopt(zmq.CURVE_SERVER, 1)
            socket.setsockopt(zmq.CURVE_SECRETKEY, self.curve[0])
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self.curve[1])
        self.zap, self.monitor = open_zap(self._context(), socket)
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as exc:
            close_zap(socket, self.zap, self.monitor)
            self.zap = self.monitor = None
            socket.close(linger=0)
            raise TransportError(f"cannot bind {endpoint}: {exc.strerror}") from None
        self.inbound = socket
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.endpoint

    def dial(self, address: str, key: bytes | None = None) -> None:
        """Open the outbound socket to `address`, where the Ed25519 `key` is expected, if not
        open yet (with another key: reopened); ZeroMQ connects and reconnects in the background
        (RECONNECT_IVL doubling up to RECONNECT_IVL_MAX). With CURVE, `key` is required."""
        if address in self.outbound:
            if self.curve is None or self.outbound[address][1] == key:
                return
            self.hangup(address)  # another node is expected there now: another server key
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
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.LINGER, s.linger_ms)
        socket.setsockopt(zmq.RECONNECT_IVL, s.reconnect_ivl_ms)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, s.reconnect_ivl_max_ms)
        socket.setsockopt(zmq.RCVHWM, 1)
        socket.setsockopt(zmq.MAXMSGSIZE, _OUTBOUND_MAX_INBOUND_BYTES)
        self._heartbeats(socket)
        if server_key is not None:
            socket.setsockopt(zmq.CURVE_SECRETKEY, self.curve[0])
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self.curve[1])
            socket.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        try:
            socket.connect(address)
        except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
            socket.close(linger=0)
            raise TransportError(f"cannot connect to {address}: {exc.strerror}") from None
        self.outbound[address] = (socket, key)

    def outbound_socket(self, address: str) -> zmq.Socket | None:
        entry = self.outbound.get(address)
        return None if entry is None else entry[0]

    def hangup(self, address: str) -> None:
        entry = self.outbound.pop(address, None)
        if entry is not None:
            entry[0].close(linger=0)

    def send(self, address: str, frame: bytes) -> bool:
        """Queue `frame` for `address` without waiting; False if it was dropped."""
        socket = self.outbound_socket(address)
        if socket is None:
            return False
        try:
            socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected, or the peer's queue is full
            return False
        return True

    async def receive(self, max_messages: int, max_bytes: int) -> list[list[zmq.Frame]]:
        """Wait for inbound messages; each is [routing id, frame, ...more parts if malformed], as
        zmq.Frame objects: `frame.get("Peer-Address")` tells where a connection comes from."""
        assert self.inbound is not None, "bind() first"
        batch = await receive_batch(self.inbound, max_messages, max_bytes, copy=False)
        for message in batch:
            self.read_frames += len(message) - 1
            self.read_bytes += sum(len(part) for part in message) - len(message[0])
        return batch

    async def close(self) -> None:
        """Close every socket; outbound frames already queued (a BYE) get up to linger_ms."""
        for address in list(self.outbound):
            self.outbound.pop(address)[0].close()  # keeps each socket's LINGER
        if self.zap is not None:
            close_zap(self.inbound, self.zap, self.monitor)
            self.zap = self.monitor = None
        if self.inbound is not None:
            trio.lowlevel.notify_closing(self.inbound.getsockopt(zmq.FD))  # wakes a waiting receiver
            self.inbound.close(linger=0)
            self.inbound = None
        if self.context is not None:
            with trio.CancelScope(shield=True):
                # term() returns once queued frames are out or LINGER expired: bounded by linger_ms.
                await trio.to_thread.run_sync(self.context.term)
