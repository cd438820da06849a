"""Connections that never speak (p2pnode/wire/inbound/silence.py): the bookkeeping on simulated time, the
handshake sizes it counts on against libzmq's own, and the shutting of a real silent connection."""

import socket
import time
from collections import Counter

import pytest
import trio
import zmq
import zmq.utils.monitor

from p2pnode.wire.inbound import buffers
from p2pnode.wire.inbound.buffers import bytes_received
from p2pnode.wire.inbound.silence import HANDSHAKE_BYTES, SILENT, SilentConnections
from protocol import Encoder, Identity, Ping

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

A, B, C = (3, ("127.0.0.1", 1000)), (4, ("127.0.0.1", 1001)), (5, ("127.0.0.1", 1002))


def test_a_connection_silent_past_its_handshake_is_shut_once_and_one_that_spoke_never():
    silence = SilentConnections(silent_s=10.0, handshake_bytes=600)
    assert silence.update({A: 567, B: 567}, now=0.0) == []
    assert silence.update({A: 567, B: 700}, now=5.0) == []  # B spoke
    assert silence.update({A: 567, B: 700, C: 0}, now=10.0) == [A]  # C only just came
    assert silence.update({B: 700, C: 567}, now=19.9) == []  # A shut; B never looked at again
    assert silence.update({B: 700, C: 567}, now=20.0) == [C]
    assert silence.update({B: 700}, now=1000.0) == []  # an honest connection idle for long: kept
    assert silence.update({}, now=1001.0) == [] and not silence.watching and not silence.spoken
    # A descriptor reused by a new connection (another peer) is watched afresh.
    assert silence.update({(3, ("127.0.0.1", 2000)): 100}, now=1002.0) == []
    assert silence.update({(3, ("127.0.0.1", 2000)): 100}, now=1012.0) == [(3, ("127.0.0.1", 2000))]


def _accepted_bytes(curve: bool, frame: bytes | None) -> int:
    """What the kernel counted on the ROUTER's side of one DEALER's connection (libzmq, set up as
    the transport's: no routing id), after its handshake and then `frame` if given."""
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    monitor = router.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        if curve:
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            router.curve_server, router.curve_secretkey, router.curve_publickey = True, server_secret, server_public
            dealer.curve_secretkey, dealer.curve_publickey = client_secret, client_public
            dealer.curve_serverkey = server_public
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        fd = None
        while (event := zmq.utils.monitor.recv_monitor_message(monitor))["event"] != zmq.EVENT_HANDSHAKE_SUCCEEDED:
            fd = event["value"] if event["event"] == zmq.EVENT_ACCEPTED else fd
        if frame is not None:
            dealer.send(frame)
            router.recv_multipart()
        time.sleep(0.05)  # the handshake's last bytes, or the frame, counted by then
        with socket.socket(fileno=fd) as accepted:
            try:
                return bytes_received((fd, accepted.getpeername()))
            finally:
                accepted.detach()
    finally:
        router.disable_monitor()
        for each in (monitor, dealer, router):
            each.close(0)
        context.term()


@pytest.mark.parametrize("mechanism", ["NULL", "CURVE"])
def test_a_handshake_stays_within_its_bound_and_the_smallest_signed_frame_takes_it_past(mechanism):
    curve = mechanism == "CURVE"
    encoder = Encoder(Identity.generate(), "test")
    smallest = encoder.encode(Ping(nonce=0), seq=1, timestamp_us=1, round=0)
    handshake = _accepted_bytes(curve, None)
    assert handshake <= HANDSHAKE_BYTES[mechanism] < _accepted_bytes(curve, smallest), (handshake, len(smallest))


async def test_the_buffer_watch_shuts_a_silent_connection_and_keeps_one_that_spoke():
    counts = Counter()
    with socket.create_server(("127.0.0.1", 0)) as server:
        silent_client = socket.create_connection(server.getsockname())
        silent, _ = server.accept()
        speaking_client = socket.create_connection(server.getsockname())
        speaking, _ = server.accept()
        speaking_client.sendall(b"x" * 200)
        live = [(s.fileno(), s.getpeername()) for s in (silent, speaking)]
        with silent_client, silent, speaking_client, speaking:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: buffers.watch_buffers(
                        lambda: list(live),
                        lambda: (0, 0),
                        1 << 30,
                        0.01,
                        counts,
                        silence=SilentConnections(0.2, 100),
                    )
                )
                with trio.fail_after(10):
                    while not counts.get(SILENT):
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            assert counts == {SILENT: 1}
            assert silent_client.recv(10) == b""  # shut: the client sees the stream end
            speaking_client.setblocking(False)
            with pytest.raises(BlockingIOError):
                speaking_client.recv(10)  # still open
