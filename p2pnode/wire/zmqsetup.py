"""How the node's ZeroMQ sockets are set up, the parts that the node and its ingress process
(inbound/process.py) share: liveness options, the ZAP endpoint and domains, and the monitors
whose events count connections (zap.py decides on them). Only pyzmq, trio and the standard
library: the ingress process imports this and must start fast.
"""

from __future__ import annotations

import itertools
import os
import socket as pysocket
import struct

import trio
import zmq

__all__ = [
    "set_liveness",
    "open_zap",
    "close_zap",
    "watch",
    "watch_handshakes",
    "read_events",
    "unwatch",
    "monitor_event",
    "remote_peer",
    "ZAP_ENDPOINT",
    "ZAP_DOMAIN",
    "PEERS_DOMAIN",
    "PUBLIC",
    "PEERS",
    "CLIENT",
    "DOMAINS",
    "FAILED_EVENTS",
]

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
ZAP_DOMAIN = b"p2pnode"  # the public socket
PEERS_DOMAIN = b"p2pnode-peers"  # the peers' socket: with CURVE, admitted peers' keys only
PUBLIC, PEERS = "public", "peers"  # the inbound sockets (inbound/supervisor.py)
CLIENT = "client"  # a node that cannot be dialled: its ROUTER dials out (inbound/process.py)
DOMAINS = {PUBLIC: ZAP_DOMAIN, PEERS: PEERS_DOMAIN, CLIENT: None}  # a client's dials ask no ZAP handler
MONITOR_QUEUE = 10_000  # monitor events held for the handler before libzmq's I/O thread waits
_MONITOR_HEADER = struct.Struct("=hi")  # a monitor message's first frame: event id, value (libzmq)
FAILED_EVENTS = {
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
    zmq.EVENT_HANDSHAKE_FAILED_AUTH,
}
_FAILED_MASK = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_EVENTS = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_CONNECTED
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


def set_liveness(socket: zmq.Socket, handshake_ivl_ms: int, keepalive_s: int) -> None:
    """On every socket, inbound and outbound (transport.py). Dead connections are found by TCP
    keepalive, not ZMTP heartbeats: libzmq 4.3 aborts the process when a heartbeat falls due on
    a connection that broke while its receive queue was full (stream_engine_base.cpp
    `!_io_error`; libzmq issues 3937, 4364, 4767), and the public socket's queues fill by design.
    A frozen peer is the node's business: its PINGs go unanswered and it is evicted (peers.py)."""
    socket.setsockopt(zmq.HANDSHAKE_IVL, handshake_ivl_ms)
    if keepalive_s:
        socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
        socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, keepalive_s)
        socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, max(1, keepalive_s // 3))
        socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


def open_zap(context: zmq.Context) -> zmq.Socket:
    """The handler's socket, for every socket of `context` that has a ZAP domain."""
    zap = context.socket(zmq.REP)
    zap.setsockopt(zmq.LINGER, 0)
    zap.bind(ZAP_ENDPOINT)
    return zap


_MONITOR_NUMBERS = itertools.count()  # of the inproc endpoints monitors publish on, one per monitor


def watch(context: zmq.Context, router: zmq.Socket, domain: bytes | None) -> zmq.Socket:
    """Before `router` binds: its ZAP domain (None: none), and a monitor of its connections."""
    if domain is not None:
        router.setsockopt(zmq.ZAP_DOMAIN, domain)
    endpoint = f"inproc://p2pnode.monitor.{next(_MONITOR_NUMBERS)}"
    router.monitor(endpoint, _EVENTS)
    monitor = context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.setsockopt(zmq.RCVHWM, MONITOR_QUEUE)
    monitor.connect(endpoint)
    return monitor


def watch_handshakes(context: zmq.Context, socket: zmq.Socket) -> zmq.Socket:
    """A monitor of the handshakes of an outbound socket's connections (transport.py): how a
    dialling node tells a node with another key from no node at all."""
    # A number never used before, not id(socket): a socket closed a moment ago may still hold
    # its monitor's endpoint while a new one gets its id (a re-dial failed "Address already in use").
    endpoint = f"inproc://p2pnode.dial-monitor.{next(_MONITOR_NUMBERS)}"
    socket.monitor(endpoint, zmq.EVENT_HANDSHAKE_SUCCEEDED | _FAILED_MASK)
    monitor = context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.LINGER, 0)
    monitor.setsockopt(zmq.RCVHWM, MONITOR_QUEUE)
    monitor.connect(endpoint)
    return monitor


def read_events(monitor: zmq.Socket) -> list[int]:
    """The events queued on `monitor`, without waiting."""
    events = []
    while True:
        try:
            events.append(monitor_event(monitor.recv_multipart(zmq.NOBLOCK))[0])
        except zmq.Again:
            return events


def unwatch(router: zmq.Socket, monitor: zmq.Socket) -> None:
    """Stop monitoring (after reading what is queued, so libzmq's I/O thread is not left waiting)."""
    while True:
        try:
            monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
    router.disable_monitor()
    _close(monitor)


def close_zap(zap: zmq.Socket) -> None:
    _close(zap)


def _close(socket: zmq.Socket) -> None:
    trio.lowlevel.notify_closing(socket.getsockopt(zmq.FD))  # wakes a task still waiting
    socket.close(linger=0)


def monitor_event(parts: list[bytes]) -> tuple[int, int]:
    """A monitor message: (event, value: the fd for ACCEPTED and DISCONNECTED). Read here, not
    with zmq.utils.monitor, which imports asyncio (1.5 MB in every daemon) to offer a coroutine."""
    if len(parts) != 2 or len(parts[0]) != _MONITOR_HEADER.size:
        raise RuntimeError(f"invalid monitor message: {parts!r}")
    return _MONITOR_HEADER.unpack(parts[0])
