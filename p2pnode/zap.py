"""Who may hold a connection to this node: ZeroMQ's ZAP hook, and the live connection counts it
decides on.

libzmq asks a ZAP handler (a REP socket at `inproc://zeromq.zap.01` in the socket's context)
about every inbound connection during its handshake, once the ROUTER has a ZAP domain: with
CURVE, after the client proved it holds the secret of its public key; without CURVE too (the
NULL mechanism), so the connection caps hold either way. The handler answers within the
handshake, before any frame of the connection is read:

- with CURVE and `[security].allowlist`: a client key that is not the transport key of a listed
  node is refused (`zap_denied_allowlist`);
- more live connections from the source address than `max_connections_per_address`, or in all
  than `max_connections`, are refused (`zap_denied_address_cap`, `zap_denied_total_cap`),
  except, with CURVE, a client that is an admitted peer: a stranger holding connections cannot
  shut peers out;
- on the peers' socket (domain `p2pnode-peers`), with CURVE, only admitted peers and keys this
  node is verifying (`zap_denied_not_peer`): strangers cannot send it the large frames that
  socket takes;
- an accepted CURVE connection gets the client's X25519 key (hex) as its User-Id, which ZeroMQ
  attaches to every frame it carries: the gate (gate.py) binds frames to it.

Live connections are counted from the ROUTER's monitor events: ACCEPTED and DISCONNECTED carry
the connection's file descriptor, whose remote address is read when it is accepted. libzmq
sends a connection's ACCEPTED before its ZAP request, and the handler reads every pending event
before it decides, so a connection is counted before it is judged. libzmq never drops a monitor
event (its I/O thread waits while the monitor's queue, `MONITOR_QUEUE`, is full), so the counts
stay exact. Every event and decision is counted in `Metrics.connections`.
"""

from __future__ import annotations

import os
import socket as pysocket
import struct
from collections import Counter
from collections.abc import Callable, Mapping

import trio
import zmq

from protocol.curve import curve_public_from_ed25519

from .config import SecuritySettings
from .zmqtrio import receive_batch

__all__ = [
    "Connections",
    "open_zap",
    "close_zap",
    "watch",
    "unwatch",
    "serve_zap",
    "ZAP_DOMAIN",
    "PEERS_DOMAIN",
    "PUBLIC",
    "PEERS",
    "DOMAINS",
]

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
ZAP_DOMAIN = b"p2pnode"  # the public socket
PEERS_DOMAIN = b"p2pnode-peers"  # the peers' socket: with CURVE, admitted peers' keys only
PUBLIC, PEERS = "public", "peers"  # the inbound sockets (transport.py)
DOMAINS = {PUBLIC: ZAP_DOMAIN, PEERS: PEERS_DOMAIN}
MONITOR_QUEUE = 10_000  # monitor events held for the handler before libzmq's I/O thread waits
_MONITOR_HEADER = struct.Struct("=hi")  # a monitor message's first frame: event id, value (libzmq)
_FAILED = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
}
_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def remote_peer(fd: int) -> tuple | None:
    """The (address, port, ...) at the other end of a connection's descriptor; None once it is
    gone or for a connection that is not over IP."""
    try:
        with pysocket.socket(fileno=os.dup(fd)) as connection:
            peer = connection.getpeername()
    except (OSError, TypeError):
        return None
    return peer if isinstance(peer, tuple) else None


class Connections:
    """Live inbound connections by source address, and the verdict on each new one."""

    def __init__(
        self,
        settings: SecuritySettings,
        counts: Counter[str],
        is_peer: Callable[[bytes], bool],
        is_verifying: Callable[[bytes], bool] = lambda key: False,
    ) -> None:
        """`is_peer(x25519 key)`: whether the key is the transport key of an admitted peer;
        `is_verifying(x25519 key)`: of a key this node is verifying (its handshake under way)."""
        self.settings, self.counts, self.is_peer, self.is_verifying = settings, counts, is_peer, is_verifying
        self.allowed: frozenset[bytes] | None = None
        if settings.curve and settings.allowlist is not None:
            self.allowed = frozenset(_curve_keys(settings.allowlist))
        self.by_fd: dict[int, str] = {}
        self.by_address: Counter[str] = Counter()
        # fd -> (its remote end, naming the TCP connection; the inbound socket it came to)
        self.tcp: dict[int, tuple[tuple, str]] = {}

    def live(self, socket: str) -> list[tuple[int, tuple]]:
        """The live TCP connections to one inbound socket as (descriptor, remote end): what
        buffers.py watches."""
        return [(fd, peer) for fd, (peer, came_to) in self.tcp.items() if came_to == socket]

    def on_event(self, event: int, fd: int, socket: str = PUBLIC) -> None:
        if event == zmq.EVENT_ACCEPTED:
            peer = remote_peer(fd)
            address = "?" if peer is None else peer[0]
            if peer is not None:
                self.tcp[fd] = (peer, socket)
            self.by_fd[fd] = address
            self.by_address[address] += 1
            self.counts["accepted"] += 1
        elif event == zmq.EVENT_DISCONNECTED:
            self.counts["disconnected"] += 1
            self.tcp.pop(fd, None)
            address = self.by_fd.pop(fd, None)
            if address is not None:
                self.by_address[address] -= 1
                if not self.by_address[address]:
                    del self.by_address[address]
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.counts["handshake_succeeded"] += 1
        elif event in _FAILED:
            self.counts["handshake_failed"] += 1

    def decide(
        self, address: str, mechanism: bytes, credentials: list[bytes], domain: bytes = ZAP_DOMAIN
    ) -> str | None:
        """The refusal of a connection from `address` (already counted), or None to accept it."""
        key = credentials[0] if mechanism == b"CURVE" and credentials else None
        if key is not None and self.allowed is not None and key not in self.allowed:
            return "zap_denied_allowlist"
        if key is not None and self.is_peer(key):
            return None  # an admitted peer is never shut out by others' connections
        if key is not None and domain == PEERS_DOMAIN and not self.is_verifying(key):
            # Strangers handshake on the public socket. A key being verified passes: it may
            # admit this node before this node admits it, dial here at once, and libzmq gives up
            # a connection for good once it is refused.
            return "zap_denied_not_peer"
        if self.by_address[address] > self.settings.max_connections_per_address:
            return "zap_denied_address_cap"
        if len(self.by_fd) > self.settings.max_connections:
            return "zap_denied_total_cap"
        return None

    def reply(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply (RFC 27) to one request: version, id, status, text, user id, metadata."""
        if len(request) < 6 or request[0] != b"1.0":
            self.counts["zap_malformed"] += 1
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed request", b"", b""]
        address, mechanism, credentials = request[3].decode(errors="replace"), request[5], request[6:]
        refusal = self.decide(address, mechanism, credentials, request[2])
        if refusal is not None:
            self.counts[refusal] += 1
            return [b"1.0", request[1], b"400", refusal.encode(), b"", b""]
        self.counts["zap_allowed"] += 1
        user_id = credentials[0].hex().encode() if mechanism == b"CURVE" and credentials else b""
        return [b"1.0", request[1], b"200", b"OK", user_id, b""]


def _curve_keys(keys) -> list[bytes]:
    derived = []
    for key in keys:
        try:
            derived.append(curve_public_from_ed25519(key))
        except ValueError:
            pass  # a listed key with no transport key can never connect
    return derived


def open_zap(context: zmq.Context) -> zmq.Socket:
    """The handler's socket, for every socket of `context` that has a ZAP domain."""
    zap = context.socket(zmq.REP)
    zap.setsockopt(zmq.LINGER, 0)
    zap.bind(ZAP_ENDPOINT)
    return zap


def watch(context: zmq.Context, router: zmq.Socket, domain: bytes) -> zmq.Socket:
    """Before `router` binds: its ZAP domain, and a monitor of its connections."""
    router.setsockopt(zmq.ZAP_DOMAIN, domain)
    endpoint = f"inproc://p2pnode.monitor.{id(router)}"
    router.monitor(endpoint, _EVENTS)
    monitor = context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.setsockopt(zmq.RCVHWM, MONITOR_QUEUE)
    monitor.connect(endpoint)
    return monitor


def unwatch(router: zmq.Socket, monitor: zmq.Socket) -> None:
    """Stop monitoring (after reading what is queued, so libzmq's I/O thread is not left waiting)."""
    _drain(monitor, None, PUBLIC)
    router.disable_monitor()
    _close(monitor)


def close_zap(zap: zmq.Socket) -> None:
    _close(zap)


def _close(socket: zmq.Socket) -> None:
    trio.lowlevel.notify_closing(socket.getsockopt(zmq.FD))  # wakes a task still waiting
    socket.close(linger=0)


def _monitor_event(parts: list[bytes]) -> tuple[int, int]:
    """A monitor message: (event, value: the fd for ACCEPTED and DISCONNECTED). Read here, not
    with zmq.utils.monitor, which imports asyncio (1.5 MB in every daemon) to offer a coroutine."""
    if len(parts) != 2 or len(parts[0]) != _MONITOR_HEADER.size:
        raise RuntimeError(f"invalid monitor message: {parts!r}")
    return _MONITOR_HEADER.unpack(parts[0])


def _drain(monitor: zmq.Socket, connections: Connections | None, socket: str) -> None:
    while True:
        try:
            parts = monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if connections is not None:
            connections.on_event(*_monitor_event(parts), socket)


async def serve_zap(zap: zmq.Socket, monitors: Mapping[str, zmq.Socket], connections: Connections) -> None:
    """Answer ZAP requests and follow the monitors' events (by inbound socket) until cancelled."""
    async with trio.open_nursery() as nursery:
        for socket, monitor in monitors.items():
            nursery.start_soon(_follow, monitor, connections, socket)
        while True:
            for request in await receive_batch(zap, 1):  # REP: one request, then its reply
                for socket, monitor in monitors.items():
                    _drain(monitor, connections, socket)  # this connection's ACCEPTED is among them
                zap.send_multipart(connections.reply(request), zmq.NOBLOCK)


async def _follow(monitor: zmq.Socket, connections: Connections, socket: str) -> None:
    while True:
        for parts in await receive_batch(monitor, 256):
            connections.on_event(*_monitor_event(parts), socket)
