"""The bound on what ZeroMQ holds (p2pnode/wire/inbound/buffers.py): the bookkeeping, and the kernel's counters."""

import contextlib
import socket
import sys

import pytest
import trio

from p2pnode.wire.inbound import buffers
from p2pnode.wire.inbound.buffers import (
    FRAME_OVERHEAD,
    GROWTH_TRIGGER,
    PER_CONNECTION_BYTES,
    BufferEstimate,
    bytes_received,
    shut_down,
)

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

MB = 1 << 20
A, B, C = (3, ("127.0.0.1", 1000)), (4, ("127.0.0.1", 1001)), (5, ("127.0.0.1", 1002))


def test_traffic_that_is_read_is_never_held_or_shed():
    estimate = BufferEstimate(limit=4 * MB)
    arrived = read = frames = 0
    for _ in range(100):
        arrived += 1 * MB
        read += 1 * MB - 1000 * FRAME_OVERHEAD  # a thousand frames, headers not read as bytes
        frames += 1000
        assert estimate.update({A: arrived, B: 100}, read, frames, seconds=0.25) == []
    assert estimate.held == 0


def test_the_connection_pumping_unread_bytes_is_shed_once_over_the_limit_not_the_older_busier_one():
    estimate = BufferEstimate(limit=4 * MB)
    # A moved 100 MB a moment ago, all of it read, and goes on at 1 MB a check; C starts pumping
    # parts that are never read.
    assert estimate.update({A: 100 * MB, C: 0}, 100 * MB, 1000, seconds=0.25) == []
    assert estimate.update({A: 101 * MB, C: 2 * MB}, 101 * MB, 1001, seconds=0.25) == []
    assert estimate.held > 1.9 * MB
    assert estimate.update({A: 102 * MB, C: 5 * MB}, 102 * MB, 1002, seconds=0.25) == [C]
    assert estimate.held <= 4 * MB


def test_several_pumps_are_shed_until_the_estimate_is_under_the_limit():
    estimate = BufferEstimate(limit=1 * MB)
    estimate.update({A: 0, B: 0, C: 0}, 0, 0, seconds=0.25)
    shed = estimate.update({A: 3 * MB, B: 2 * MB, C: 10_000}, 0, 0, seconds=0.25)
    assert shed == [A, B]


def test_nobody_is_blamed_when_nothing_arrived_lately():
    # What libzmq holds may be honest frames waiting while the node is busy: with nothing
    # arriving, shedding anyone frees nothing that is growing.
    estimate = BufferEstimate(limit=1 * MB)
    estimate.update({A: 0}, 0, 0, seconds=0.25)
    assert estimate.update({A: 3 * MB}, 0, 0, seconds=0.25) == [A]
    estimate = BufferEstimate(limit=1 * MB, held=3 * MB)
    for _ in range(25):
        assert estimate.update({A: 0, B: 0}, 0, 0, seconds=0.25) == []


def test_idle_connections_heartbeats_and_new_handshakes_do_not_add_up():
    estimate = BufferEstimate(limit=1 * MB)
    connections = {(fd, ("10.0.0.1", fd)): 0 for fd in range(1000)}
    for step in range(1, 400):  # 100 s of 1000 idle connections, 100 bytes of heartbeats a second
        estimate.update(dict.fromkeys(connections, 25 * step + 2000), 0, 0, seconds=0.25)
    assert estimate.held == 0


def test_a_closed_connection_is_forgotten_and_a_reused_descriptor_starts_afresh():
    estimate = BufferEstimate(limit=1 * MB)
    estimate.update({A: 500 * MB}, 500 * MB, 10, seconds=0.25)
    estimate.update({}, 500 * MB, 10, seconds=0.25)
    assert estimate.totals == {} and estimate.recent == {}
    reused = (A[0], ("127.0.0.1", 2000))
    assert estimate.update({reused: 1000}, 500 * MB, 10, seconds=0.25) == []
    assert estimate.held == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO's layout is Linux's")
def test_the_kernel_counts_what_a_connection_received_and_a_shut_down_connection_ends():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with client, accepted:
            client.sendall(b"x" * 123_456)
            received = b""
            while len(received) < 123_456:
                received += accepted.recv(1 << 20)
            connection = (accepted.fileno(), accepted.getpeername())
            assert bytes_received(connection) == 123_456
            assert bytes_received((accepted.fileno(), ("127.0.0.1", 1))) is None  # not that connection
            assert shut_down(connection)
            assert client.recv(10) == b""  # the client sees the stream end
            assert accepted.fileno() >= 0  # the descriptor stays the owner's to close


async def test_what_connections_that_left_held_beyond_their_own_room_is_given_back(monkeypatch, autojump_clock):
    # A sender of parts that never finish, which leaves by itself, is never shed: libzmq frees
    # its parts, but the freed pages stayed in the heap (+7 MB held for good after 12 MB of parts).
    # On trio's mock clock (it jumps while every task sleeps): each wait below is for checks the
    # watcher made, and a watcher that never checks fails at once instead of passing.
    size, trims, seen = [100 * MB], [], []
    monkeypatch.setattr(buffers, "resident_bytes", lambda: size[0])
    monkeypatch.setattr(buffers, "trim_now", lambda: trims.append(size[0]))
    scan = buffers._scan

    def looked(connections, ended_too):
        seen.append((len(connections), size[0]))  # what this check of the watcher's saw
        return scan(connections, ended_too)

    monkeypatch.setattr(buffers, "_scan", looked)

    async def until(condition) -> None:
        with trio.fail_after(10):  # mock seconds: at once in real time where it never comes
            while not condition():
                await trio.sleep(0.005)

    async def checks(count: int) -> list[tuple[int, int]]:
        """The watcher's next `count` checks: the connections and the process's size each saw. A
        trim one of them called for is done before the next check."""
        start = len(seen)
        await until(lambda: len(seen) >= start + count)
        return seen[start:]

    with socket.create_server(("127.0.0.1", 0)) as server, contextlib.ExitStack() as sockets:
        clients = [sockets.enter_context(socket.create_connection(server.getsockname())) for _ in range(3)]
        accepted = [sockets.enter_context(server.accept()[0]) for _ in clients]
        live = [(s.fileno(), s.getpeername()) for s in accepted]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(buffers.watch_buffers, lambda: list(live), lambda: (0, 0), 1 << 30, 0.01, {})
            assert await checks(2) == [(3, 100 * MB)] * 2
            size[0] += GROWTH_TRIGGER + MB
            # Grown, but everyone is still there: what it holds is in use. Kept, by checks that
            # saw it.
            assert await checks(3) == [(3, size[0])] * 3 and trims == []
            live.pop()
            await until(lambda: trims)
            assert trims == [size[0]]
            assert await checks(3) == [(2, size[0])] * 3 and trims == [size[0]]  # once, not again until it grows anew
            # Two leave, the process having grown by no more than their own room (and the
            # trigger): kept, for the next connections...
            size[0] += GROWTH_TRIGGER + 2 * PER_CONNECTION_BYTES
            live.clear()
            assert await checks(3) == [(0, size[0])] * 3 and len(trims) == 1
            # ... and a byte more is given back: the watcher was still looking, at that bound.
            size[0] += 1
            await checks(2)
            assert trims[1:] == [size[0]]
            nursery.cancel_scope.cancel()
