"""The outbound side of transport.py against real ZeroMQ sockets: a large frame for a peer whose
peers' connection is still opening waits for it (bounded), instead of being dropped."""

import socket
import time

import pytest
import zmq

from p2pnode.wire.settings import TransportSettings
from p2pnode.wire.transport import DROPPED, SENT, WAITING, Transport

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

PUBLIC_BOUND = 64 << 10
LARGE = bytes(PUBLIC_BOUND + 1)  # must go on the peers' socket


def _router() -> tuple[zmq.Socket, str]:
    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    return router, f"tcp://127.0.0.1:{port}"


def _reserved_address() -> str:
    """An address nothing listens on yet (its port is free now)."""
    router, address = _router()
    router.close(linger=0)
    return address


@pytest.fixture
def silent():
    """An address where TCP connections are taken but no ZeroMQ handshake ever answers: a
    connection there never comes up. (Not a free port: on loopback a connection retried there
    can, rarely, pick that same port as its own and connect to itself, and then it is up.)"""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"


def _dial(transport: Transport, public: zmq.Socket, address: str) -> None:
    """Dial `address` and wait until its public connection is up (a frame sent there is taken)."""
    transport.dial(address)
    deadline = time.monotonic() + 5.0
    while transport.send(address, b"up?") is not SENT:
        assert time.monotonic() < deadline, "the public connection never came up"
        time.sleep(0.01)
    assert public.poll(5000) and public.recv_multipart()[1] == b"up?"


def _close(transport: Transport) -> None:
    for address in list(transport.outbound):
        transport.hangup(address)
    transport.context.term()


def _send_waiting_until(transport: Transport, tags: int, seconds: float = 5.0) -> tuple[list, list]:
    sent, given_up = [], []
    deadline = time.monotonic() + seconds
    while len(sent) + len(given_up) < tags and time.monotonic() < deadline:
        more_sent, more_given_up = transport.send_waiting()
        sent += more_sent
        given_up += more_given_up
        time.sleep(0.01)
    return sent, given_up


def test_a_large_frame_waits_for_the_peers_connection_then_goes_out_in_order():
    public, public_address = _router()
    peers_address = _reserved_address()
    transport = Transport(TransportSettings(send_hwm=3), 1 << 20, max_public_frame_bytes=PUBLIC_BOUND)
    try:
        _dial(transport, public, public_address)
        transport.dial_peers(public_address, peers_address)  # nobody listens there yet
        assert transport.send(public_address, LARGE + b"1", tag="first") is WAITING
        assert transport.send(public_address, LARGE + b"2", tag="second") is WAITING
        # A small frame meanwhile goes on the public connection; the waiting ones keep their place.
        assert transport.send(public_address, b"small", tag="small") is SENT
        assert transport.waiting == 2
        assert transport.send_waiting() == ([], [])
        peers = zmq.Context.instance().socket(zmq.ROUTER)
        peers.bind(peers_address)
        try:
            assert _send_waiting_until(transport, 2) == (["first", "second"], [])
            assert transport.send(public_address, LARGE + b"3") is SENT  # the connection is up: no wait
            peers.setsockopt(zmq.RCVTIMEO, 5000)
            assert [peers.recv_multipart()[1][-1:] for _ in range(3)] == [b"1", b"2", b"3"]
            assert public.poll(5000) and public.recv_multipart()[1] == b"small"
        finally:
            peers.close(linger=0)
    finally:
        _close(transport)
        public.close(linger=0)


def test_what_waits_is_bounded_in_count_and_time_and_given_up_on_hangup(silent):
    public, public_address = _router()
    transport = Transport(
        TransportSettings(send_hwm=2, connect_wait_s=0.3), 1 << 20, max_public_frame_bytes=PUBLIC_BOUND
    )
    try:
        _dial(transport, public, public_address)
        transport.dial_peers(public_address, silent)  # never answers
        outcomes = [transport.send(public_address, LARGE, tag=index) for index in range(3)]
        assert outcomes == [WAITING, WAITING, DROPPED]  # at most send_hwm wait
        assert _send_waiting_until(transport, 2, seconds=3.0) == ([], [0, 1])  # after connect_wait_s
        assert transport.send(public_address, LARGE, tag="late") is WAITING
        assert transport.send(public_address, LARGE) is WAITING  # untracked: never reported (a raw frame)
        transport.hangup(public_address)
        assert transport.send_waiting() == ([], ["late"]) and transport.waiting == 0
        assert transport.send(public_address, LARGE) is DROPPED  # no connection at all
    finally:
        _close(transport)
        public.close(linger=0)
    # connect_wait_s = 0: dropped at once, as before the wait existed.
    transport = Transport(TransportSettings(connect_wait_s=0), 1 << 20, max_public_frame_bytes=PUBLIC_BOUND)
    public, public_address = _router()
    try:
        _dial(transport, public, public_address)
        transport.dial_peers(public_address, silent)
        assert transport.send(public_address, LARGE) is DROPPED
    finally:
        _close(transport)
        public.close(linger=0)


def test_a_one_frame_connection_delivers_once_up_and_is_closed_when_its_time_is_up_or_at_close(silent):
    """`send_once` (a dial-back's DIALED): the frame is queued before the connection is up and
    arrives; the socket is closed once its time is up, and a node closing does not wait for one
    whose frame never got out (a dial-back to a closed port)."""
    import trio

    transport = Transport(TransportSettings(), 1 << 20)
    public, address = _router()
    transport.send_once(address, None, b"dialed", within_s=5.0)
    assert public.poll(5000) and public.recv_multipart()[1] == b"dialed"
    transport.close_expired(time.monotonic() + 5.0)
    assert not transport._once
    transport.send_once(silent, None, b"lost", within_s=60.0)  # no handshake there: never out
    started = time.monotonic()
    trio.run(transport.close)
    assert time.monotonic() - started < transport.settings.linger_ms / 1000 + 1.0  # not the 60 s
    public.close(linger=0)
