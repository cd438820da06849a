"""resets.py: which connections were reset by their other end, told before the thread that
watches for them has run (the node must hear of a reset before the abort it causes)."""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

import pytest

from p2pnode.wire.inbound.resets import ResetWatch, was_reset

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="epoll and TCP_INFO are Linux's")


@pytest.fixture
def accepted():
    """Connections to a listener here: (the client, its accepted end), as many as asked."""
    listener = socket.create_server(("127.0.0.1", 0))
    opened = []

    def connect() -> tuple[socket.socket, socket.socket]:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        opened.extend((client, server))
        return client, server

    yield connect
    for sock in [*opened, listener]:
        sock.close()


def _reset(client: socket.socket) -> None:
    """Close with a RST, as the stall-reset attack does (SO_LINGER 0)."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_take_hands_over_a_reset_the_thread_has_not_seen(accepted):
    """The watch's thread never runs here (no `with`): `take` alone finds the reset, once."""
    watch = ResetWatch(found=lambda: None)
    try:
        client, server = accepted()
        watch.watch(server.fileno(), ("127.0.0.1", 1))
        assert watch.take() == []
        _reset(client)
        _until(lambda: was_reset(server.fileno()))
        assert watch.take() == [(server.fileno(), ("127.0.0.1", 1))]
        assert watch.take() == []  # claimed once
    finally:
        watch.__exit__()


def test_the_thread_claims_a_reset_and_take_hands_it_over_once(accepted):
    woken = threading.Event()
    with ResetWatch(found=woken.set) as watch:
        client, server = accepted()
        watch.watch(server.fileno(), ("127.0.0.1", 2))
        _reset(client)
        assert woken.wait(5.0)
        assert watch.take() == [(server.fileno(), ("127.0.0.1", 2))]
        assert watch.take() == []


def test_an_orderly_close_and_this_nodes_own_shutdown_are_no_resets(accepted):
    woken = threading.Event()
    with ResetWatch(found=woken.set) as watch:
        closed, closed_end = accepted()
        _, shut_end = accepted()
        watch.watch(closed_end.fileno(), ("127.0.0.1", 3))
        watch.watch(shut_end.fileno(), ("127.0.0.1", 4))
        closed.close()  # a FIN
        shut_end.shutdown(socket.SHUT_RDWR)  # what buffers.py does to a connection it sheds
        time.sleep(0.2)
        assert watch.take() == [] and not woken.is_set()
        # A descriptor it was told to forget is not told of either.
        reset, reset_end = accepted()
        watch.watch(reset_end.fileno(), ("127.0.0.1", 5))
        watch.forget(reset_end.fileno())
        _reset(reset)
        _until(lambda: was_reset(reset_end.fileno()))
        assert watch.take() == []
