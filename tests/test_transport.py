"""The outbound side of transport.py against real ZeroMQ sockets: a large frame for a peer whose
peers' connection is still opening waits for it (bounded), instead of being dropped."""

import time

import pytest
import zmq

from p2pnode.wire.settings import TransportSettings
from p2pnode.wire.transport import DROPPED, SENT, WAITING, Transport

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

PUBLIC_BOUND = 64 << 10
LARGE = bytes(PUBLIC_BOUND + 1)  # must go on the peers' socket


def _router() -> tuple[zmq.Socket, str]:
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    return socket, f"tcp://127.0.0.1:{port}"


def _reserved_address() -> str:
    """An address nothing listens on yet (its port is free now)."""
    socket, address = _router()
    socket.close(linger=0)
    return address


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


def test_what_waits_is_bounded_in_count_and_time_and_given_up_on_hangup():
    public, public_address = _router()
    transport = Transport(
        TransportSettings(send_hwm=2, connect_wait_s=0.3), 1 << 20, max_public_frame_bytes=PUBLIC_BOUND
    )
    try:
        _dial(transport, public, public_address)
        transport.dial_peers(public_address, _reserved_address())  # never answers
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
        transport.dial_peers(public_address, _reserved_address())
        assert transport.send(public_address, LARGE) is DROPPED
    finally:
        _close(transport)
        public.close(linger=0)
