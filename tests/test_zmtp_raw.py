"""tools/zmtp.py against libzmq itself (pyzmq): what the raw client sends arrives intact at a
ROUTER, NULL and CURVE, libzmq answers its PING, and the raw server feeds a DEALER that dials it."""

import socket
import struct

import pytest
import zmq

from tools import zmtp
from tools.attack import CURVE_ONLY, MALFORMED

from .conftest import fixed_identity

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

SERVER = fixed_identity(1)  # a node: its CURVE key derives from its Ed25519 key
CLIENT = fixed_identity(2)


@pytest.fixture
def new_socket():
    """pyzmq sockets, each closed after the test."""
    context, made = zmq.Context(), []

    def make(kind: int) -> zmq.Socket:
        made.append(context.socket(kind))
        made[-1].setsockopt(zmq.LINGER, 0)
        return made[-1]

    yield make
    for made_socket in made:
        made_socket.close()
    context.term()


def bound_router(new_socket, curve: bool) -> tuple[zmq.Socket, str]:
    """A ROUTER on a loopback port; over CURVE with SERVER's key and no ZAP handler, which admits
    any client key (as a node's public socket does)."""
    router = new_socket(zmq.ROUTER)
    router.setsockopt(zmq.RCVTIMEO, 5000)  # a lost message fails the test instead of hanging it
    if curve:
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.setsockopt(zmq.CURVE_SECRETKEY, SERVER.curve_keypair()[0])
    port = router.bind_to_random_port("tcp://127.0.0.1")
    return router, f"tcp://127.0.0.1:{port}"


def server_key(curve: bool) -> bytes | None:
    return SERVER.curve_keypair()[1] if curve else None


@pytest.mark.parametrize("curve", [False, True], ids=["null", "curve"])
def test_a_router_receives_the_raw_clients_messages_intact(new_socket, curve):
    router, address = bound_router(new_socket, curve)
    connection = zmtp.connect(address, server_key=server_key(curve), secret_key=CLIENT.curve_keypair()[0])
    try:
        long_part = bytes(range(256)) * 3  # past 255 bytes: a LONG frame
        connection.send(b"one")
        connection.send(b"a", long_part, b"")
        # Several messages in one segment, as tools/attack.py sends them: the nonces follow on.
        connection.send_raw(b"".join(connection.message_bytes(b"m%d" % i, b"tail") for i in range(20)))
        routing_id, first = router.recv_multipart()
        assert first == b"one"
        assert router.recv_multipart() == [routing_id, b"a", long_part, b""]
        for i in range(20):
            assert router.recv_multipart() == [routing_id, b"m%d" % i, b"tail"]
    finally:
        connection.close()


@pytest.mark.parametrize("curve", [False, True], ids=["null", "curve"])
def test_libzmq_answers_the_raw_clients_ping_with_a_pong_echoing_16_bytes_of_context(new_socket, curve):
    _, address = bound_router(new_socket, curve)
    connection = zmtp.connect(address, server_key=server_key(curve))
    try:
        connection.send_command(zmtp.ping(ttl=10, context=b"ab"))
        assert connection.receive() == zmtp.Frame(zmtp.COMMAND, zmtp.command(b"PONG", b"ab"))
        connection.send_command(zmtp.ping(ttl=0, context=bytes(range(255))))  # a LONG command frame
        assert connection.receive() == zmtp.Frame(zmtp.COMMAND, zmtp.command(b"PONG", bytes(range(16))))
    finally:
        connection.reset()


def test_a_curve_server_refuses_a_hello_for_another_key_and_a_null_client(new_socket):
    _, address = bound_router(new_socket, curve=True)
    with pytest.raises(ConnectionError):  # HELLO's box does not open: libzmq drops the connection
        zmtp.connect(address, server_key=CLIENT.curve_keypair()[1])
    # A mechanism mismatch: libzmq closes the connection, with our READY unread (an RST) or not
    # (we read its greeting: ZmtpError, a ConnectionError).
    with pytest.raises(ConnectionError):
        zmtp.connect(address)


@pytest.mark.parametrize("curve", [False, True], ids=["null", "curve"])
def test_the_raw_server_feeds_a_dealer_that_dials_it(new_socket, curve):
    with zmtp.Listener(secret_key=SERVER.curve_keypair()[0] if curve else None) as listener:
        dealer = new_socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 5000)
        if curve:
            secret, public = CLIENT.curve_keypair()
            dealer.setsockopt(zmq.CURVE_SECRETKEY, secret)
            dealer.setsockopt(zmq.CURVE_PUBLICKEY, public)
            dealer.setsockopt(zmq.CURVE_SERVERKEY, SERVER.curve_keypair()[1])
        dealer.connect(listener.address)
        connection = listener.accept()
        try:
            assert listener.client_key == (CLIENT.curve_keypair()[1] if curve else None)
            connection.send(b"hello")
            connection.send(b"x", bytes(1000), b"z")
            assert dealer.recv_multipart() == [b"hello"]
            assert dealer.recv_multipart() == [b"x", bytes(1000), b"z"]
            connection.send_command(zmtp.ping(ttl=10, context=b"cd"))  # the dialer's engine answers too
            assert connection.receive() == zmtp.Frame(zmtp.COMMAND, zmtp.command(b"PONG", b"cd"))
            dealer.send(b"back")
            assert connection.receive() == zmtp.Frame(0, b"back")
        finally:
            connection.reset()


@pytest.mark.parametrize("curve", [False, True], ids=["null", "curve"])
def test_every_malformed_case_of_the_attack_tool_runs_and_a_router_still_serves_after_them(new_socket, curve):
    """tools/attack.py's catalogue, each case once, reset then once closed: the cases run as
    written (each gets its connection, and its handshake where it needs one), and libzmq drops or
    ignores every one of them: a well-formed client is still served."""
    router, address = bound_router(new_socket, curve)
    for name, case in MALFORMED.items():
        if name in CURVE_ONLY and not curve:
            continue
        for reset in (True, False):
            connection = case(address, server_key(curve))
            if reset:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()
    connection = zmtp.connect(address, server_key=server_key(curve))
    try:
        connection.send(b"still here")
        while router.recv_multipart()[1:] != [b"still here"]:
            pass  # what the cases sent that libzmq delivers as messages (a ZMTP 1.0 peer's noise)
        connection.send_command(zmtp.ping(ttl=10, context=b"ok"))
        assert connection.receive() == zmtp.Frame(zmtp.COMMAND, zmtp.command(b"PONG", b"ok"))
    finally:
        connection.close()
