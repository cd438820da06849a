"""Sending over the connections an ingress process holds (issue #46): a node behind a NAT cannot
be dialled, so whatever reaches it must come back over a connection it dialled. A client
ingress (CLIENT) dials out from its ROUTER; the node it dialled replies over the connection the
frame came on (`Ingress.reply`); both sides' sends are bounded and counted, and a client's dials
outlive its process."""

import os
import signal
import time
from collections import Counter
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import trio
import zmq

from p2pnode.wire.inbound.routes import Replies
from p2pnode.wire.inbound.sends import SEND_FULL, SEND_GONE, SEND_OVER_BYTES, SEND_OVER_CONNECTION_BYTES, RoutedSends
from p2pnode.wire.inbound.supervisor import SEND_TOO_LARGE, BindError, Ingress
from p2pnode.wire.settings import SecuritySettings, TransportSettings
from p2pnode.wire.zap import Connections
from p2pnode.wire.zmqsetup import CLIENT, PEERS, PUBLIC
from protocol import Identity
from protocol.messages import client_address

PUBLIC_BOUND = 64 << 10


def _ingress(name: str, curve: tuple[bytes, bytes] | None, counts: Counter, **settings) -> Ingress:
    """With CURVE the peers' socket takes admitted peers' keys only: here, every key is one."""
    connections = Connections(SecuritySettings(), counts, lambda key: True)
    bound = PUBLIC_BOUND if name == PUBLIC else 1 << 20
    return Ingress(name, TransportSettings(**settings), bound, curve, connections, counts)


@asynccontextmanager
async def _dialled(server: Ingress, client: Ingress, server_key: bytes | None = None):
    """`server` bound on loopback, `client` dialled to it (its connection named b"server") and
    both supervised; both closed after."""
    try:
        async with trio.open_nursery() as nursery:
            endpoint = await server.start("tcp://127.0.0.1:0")
            assert await client.start(None) is None  # binds nothing: nobody can dial it
            nursery.start_soon(server.supervise)
            nursery.start_soon(client.supervise)
            client.connect(endpoint, b"server", server_key)
            yield
            nursery.cancel_scope.cancel()
    finally:
        await server.close()
        await client.close()


async def _next_frame(ingress: Ingress) -> tuple[bytes, bytes]:
    with trio.fail_after(10):
        routing_id, frame, *_ = (await ingress.receive(1, 1 << 22))[0]
    return routing_id, frame.bytes


@pytest.mark.parametrize("curve", [False, True], ids=["plaintext", "curve"])
async def test_a_client_dials_out_and_both_ends_send_over_its_one_connection(curve):
    server_key, client_key = Identity.generate(), Identity.generate()
    counts = {name: Counter() for name in (PEERS, CLIENT)}
    server = _ingress(PEERS, server_key.curve_keypair() if curve else None, counts[PEERS])
    client = _ingress(CLIENT, client_key.curve_keypair() if curve else None, counts[CLIENT])
    async with _dialled(server, client, server_key.curve_keypair()[1] if curve else None):
        assert client.send(b"server", b"hello")
        routing_id, frame = await _next_frame(server)
        assert frame == b"hello"
        assert server.reply(routing_id, bytes(300_000))  # larger than pyzmq copies: tracked
        assert await _next_frame(client) == ((1).to_bytes(4, "big") + b"server", bytes(300_000))
        assert client.send(b"server", b"again")
        assert (await _next_frame(server)) == (routing_id, b"again")  # the same connection, both ways
        with trio.fail_after(5):  # the processes tell their counts every quarter of a second
            while counts[PEERS]["routed_sent"] < 1 or counts[CLIENT]["routed_sent"] < 2:
                await trio.sleep(0.05)


async def test_replies_for_a_gone_process_or_over_the_bound_are_dropped_and_counted():
    counts = Counter()
    server = _ingress(PUBLIC, None, counts)
    client = _ingress(CLIENT, None, Counter())
    async with _dialled(server, client):
        client.send(b"server", b"hello")
        routing_id, _ = await _next_frame(server)
        assert not server.reply(routing_id, bytes(PUBLIC_BOUND + 1))  # the public socket sends no models
        assert not server.reply((7).to_bytes(4, "big") + routing_id[4:], b"x")  # a process that is not this one
        assert server.reply(routing_id[:4] + b"nobody", b"x")  # queued, and refused in the process: no such connection
        with trio.fail_after(5):
            while counts[SEND_GONE] < 2:
                await trio.sleep(0.05)
    assert counts[SEND_TOO_LARGE] == 1 and counts[SEND_GONE] == 2 and not counts["routed_sent"]


def _not_reading(context: zmq.Context, send_hwm: int) -> tuple[zmq.Socket, zmq.Socket]:
    """A ROUTER that never reads, and a ROUTER dialled to it (the connection named b"reader")."""
    reader = context.socket(zmq.ROUTER)
    reader.setsockopt(zmq.RCVHWM, 1)
    port = reader.bind_to_random_port("tcp://127.0.0.1")
    sender = context.socket(zmq.ROUTER)
    for option, value in ((zmq.ROUTER_MANDATORY, 1), (zmq.SNDHWM, send_hwm), (zmq.SNDBUF, 4096)):
        sender.setsockopt(option, value)
    sender.setsockopt(zmq.CONNECT_ROUTING_ID, b"reader")
    sender.connect(f"tcp://127.0.0.1:{port}")
    return reader, sender


@pytest.mark.parametrize("frame_bytes", [4 << 20, 20_000], ids=["models", "handshakes"])
def test_what_libzmq_holds_to_send_is_bounded_in_bytes(frame_bytes):
    """A peer that does not read: frames pile up in libzmq up to `max_bytes` (small frames
    too, which pyzmq would copy and let go of untracked), then are dropped and counted."""
    with zmq.Context() as context:
        sockets = _not_reading(context, 1000)
        try:
            sends = RoutedSends(sockets[1], 10 * frame_bytes, Counter(), 1 << 40)
            taken = sum(sends.send(b"reader", bytes(frame_bytes)) for _ in range(100))
            assert sends.counts[SEND_OVER_BYTES] > 0 and sends.held <= 10 * frame_bytes and taken >= 2
        finally:
            for socket in sockets:
                socket.close(linger=0)


def _sent_once_connected(sends: RoutedSends, routing_id: bytes, size: int) -> None:
    """Send a frame of `size` bytes to `routing_id` as soon as its connection is up (within 10 s)."""
    deadline = time.monotonic() + 10
    while not sends.send(routing_id, bytes(size)):
        assert time.monotonic() < deadline, sends.counts
        time.sleep(0.01)


def test_a_connection_that_stops_reading_holds_its_share_and_the_others_still_get_theirs():
    """Two readers that never read, on one ROUTER: the first fills its share of what libzmq may
    hold to send, and its next frames are refused and counted; the second still gets frames
    through, up to a share of its own."""
    frame, share = 100_000, 1_000_000
    with zmq.Context() as context:
        first, sender = _not_reading(context, 1000)
        second = context.socket(zmq.ROUTER)
        second.setsockopt(zmq.RCVHWM, 1)
        port = second.bind_to_random_port("tcp://127.0.0.1")
        sender.setsockopt(zmq.CONNECT_ROUTING_ID, b"second")
        sender.connect(f"tcp://127.0.0.1:{port}")
        try:
            sends = RoutedSends(sender, 3 * share, Counter(), share)
            _sent_once_connected(sends, b"reader", frame)
            taken = 1 + sum(sends.send(b"reader", bytes(frame)) for _ in range(50))
            assert sends.counts[SEND_OVER_CONNECTION_BYTES] > 0 and not sends.counts[SEND_OVER_BYTES]
            assert sends.held_by[b"reader"] <= share and taken >= 2
            _sent_once_connected(sends, b"second", frame)
            assert sends.held_by[b"second"] >= frame and sends.held <= 2 * share
        finally:
            for socket in (first, second, sender):
                socket.close(linger=0)


def test_frames_for_a_full_queue_or_no_connection_are_dropped_and_counted():
    with zmq.Context() as context:
        sockets = _not_reading(context, 4)
        try:
            sends = RoutedSends(sockets[1], 1 << 40, Counter(), 1 << 40)
            for _ in range(50):  # nothing drains: the queue fills
                sends.send(b"reader", bytes(100_000))
            assert sends.counts[SEND_FULL] > 0
            assert not sends.send(b"someone else", b"x") and sends.counts[SEND_GONE] == 1
        finally:
            for socket in sockets:
                socket.close(linger=0)


async def test_a_client_dials_again_from_the_process_that_replaces_one_that_ended():
    counts = Counter()
    server = _ingress(PEERS, None, Counter())
    client = _ingress(CLIENT, None, counts)
    async with _dialled(server, client):
        client.send(b"server", b"before")
        assert (await _next_frame(server))[1] == b"before"
        os.kill(client.pid, signal.SIGKILL)
        with trio.fail_after(10):
            while client.restarts == 0 or client.pid is None:
                await trio.sleep(0.02)
        with trio.fail_after(10):  # the new process dialled the same endpoint again
            while not client.send(b"server", b"after") or counts["routed_sent"] < 1:
                await trio.sleep(0.05)
            routing_id, frame = await _next_frame(server)
        assert frame == b"after"
        server.reply(routing_id, b"back")
        assert (await _next_frame(client))[1] == b"back"


async def test_a_socket_libzmq_refuses_to_set_up_is_a_bind_error_not_a_hang(monkeypatch):
    """Every socket of a process whose setup fails is closed, so the process ends and says
    why (a socket left open held it in `context.term()`, and the node waited)."""
    server = _ingress(PEERS, None, Counter())
    setup = server._setup
    monkeypatch.setattr(server, "_setup", lambda endpoint: {**setup(endpoint), "recv_hwm": -1})
    with trio.fail_after(10), pytest.raises(BindError, match="cannot bind"):
        await server.start("tcp://127.0.0.1:0")
    await server.close()


def test_a_client_s_route_is_a_peer_s_from_its_admission_and_no_stranger_pushes_it_out():
    """Routes learned from strangers' frames are bounded (the least recently heard leave first);
    an admitted client's is kept from its admission on, before any frame of its own as a peer."""
    peers: set[bytes] = set()
    replies = Replies({}, PUBLIC_BOUND, 2, peers.__contains__, 1.0, 10)
    key, *strangers = (Identity.generate().public_key for _ in range(4))
    replies.learn(client_address(key), PUBLIC, b"route", peer=False)  # its HELLO, as a stranger
    replies.admitted(client_address(key))
    for stranger in strangers:  # more strangers than the table keeps
        replies.learn(client_address(stranger), PUBLIC, stranger[:4], peer=False)
    assert replies.routes[client_address(key)] == {PUBLIC: b"route"} and len(replies.strangers) == 2
    peers.add(key)
    replies.seen(SimpleNamespace(sender=key), PEERS, b"peers")  # a later frame adds the peers' socket's route
    assert replies.routes[client_address(key)] == {PUBLIC: b"route", PEERS: b"peers"}


async def test_a_refused_dial_is_dialled_again_once_allowed_and_the_client_s_other_connections_stay():
    """The peers' socket refuses a client not admitted yet; it dials again (`redial_s`) once it is,
    over the same routing id, while its connection to another node carries on. Dialled anew right
    after undoing the refused dial, libzmq aborted the client's process (router.cpp
    `!has_out_pipe`) or ended that other connection: the refused dial is undone at once."""
    keys = {name: Identity.generate() for name in ("refusing", "other", "client")}
    admitted = False
    counts = {name: Counter() for name in keys}

    def server(name: str, is_peer) -> Ingress:
        connections = Connections(SecuritySettings(), counts[name], is_peer)
        return Ingress(PEERS, TransportSettings(), 1 << 20, keys[name].curve_keypair(), connections, counts[name])

    refusing, other = server("refusing", lambda key: admitted), server("other", lambda key: True)
    client = _ingress(CLIENT, keys["client"].curve_keypair(), counts["client"], redial_s=0.1)
    async with _dialled(other, client, keys["other"].curve_keypair()[1]):
        endpoint = await refusing.start("tcp://127.0.0.1:0")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refusing.supervise)
            client.connect(endpoint, b"refusing", keys["refusing"].curve_keypair()[1])
            with trio.fail_after(10):
                while not counts["refusing"]["zap_denied_not_peer"]:
                    await trio.sleep(0.02)
            admitted = True
            with trio.fail_after(10):
                while endpoint not in client.connected:
                    await trio.sleep(0.02)
            for routing_id, ingress in ((b"refusing", refusing), (b"server", other)):  # _dialled names it "server"
                assert client.send(routing_id, b"hello")
                assert (await _next_frame(ingress))[1] == b"hello"
            assert client.restarts == 0
            nursery.cancel_scope.cancel()
        await refusing.close()


async def test_frames_waiting_for_the_process_are_bounded_per_connection_not_in_all():
    """What the node queues for its ingress process is bounded per connection (`send_hwm`
    frames) and in bytes, not in frames for all: a relay's burst for one client (a round's
    payloads of every other client) is not dropped because its other connections keep the
    process busy (tools/bench/nat_fleet.py lost 80 RELAYED so while a stranger's keys were pinged)."""
    counts: Counter = Counter()
    client = _ingress(CLIENT, None, counts, send_hwm=3)
    assert all(client.send(b"busy", b"frame") for _ in range(3))
    assert not client.send(b"busy", b"frame") and counts["routed_send_queue_full"] == 1  # its own bound
    assert all(client.send(b"burst", b"frame") for _ in range(3))  # another connection's room is its own
    bytes_bound = _ingress(CLIENT, None, Counter(), send_hwm=1000, max_routed_send_bytes=1 << 16)
    assert bytes_bound.send(b"a", bytes(60_000)) and not bytes_bound.send(b"b", bytes(10_000))  # in all, in bytes
