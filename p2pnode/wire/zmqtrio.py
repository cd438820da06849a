"""Drive pyzmq sockets from trio through ZeroMQ's edge-triggered notification descriptor.

ZMQ_FD becomes readable when the socket's event state *may* have changed; ZMQ_EVENTS says what
is actually possible and re-arms the edge. So: try the operation with NOBLOCK, and only when it
would block, check EVENTS and wait on the descriptor. Measured on this machine against
zmq-anyio (see BENCHMARKS.md): this adapter moves 20 KB frames as fast as blocking pyzmq
(0.9-1.3x), zmq-anyio at 0.1x.

One task at a time may wait on a given socket (trio refuses two waiters on one descriptor);
the transport keeps it so: one receiving task, and sends that never wait. A send on a socket
another task is reading can consume the edge that task waits for: whoever sends there calls
`Wakeup.wake` after it, and the reader looks at ZMQ_EVENTS again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import zmq

__all__ = ["wait_for", "receive_batch", "receive_routed", "send_waiting", "Wakeup"]

Ready = Callable[[], Awaitable[None]]


class Wakeup:
    """Lets a task that used a socket make the task waiting on it look again (the module's
    docstring)."""

    def __init__(self) -> None:
        self._waiting: trio.CancelScope | None = None

    def wake(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()

    async def wait_readable(self, fd: int) -> None:
        with trio.CancelScope() as self._waiting:
            await trio.lowlevel.wait_readable(fd)
        self._waiting = None


async def wait_for(socket: zmq.Socket, event: int, wakeup: Wakeup | None = None) -> None:
    """Return once `event` (zmq.POLLIN or zmq.POLLOUT) is possible on `socket`."""
    fd = socket.getsockopt(zmq.FD)
    while not socket.getsockopt(zmq.EVENTS) & event:
        await (trio.lowlevel.wait_readable(fd) if wakeup is None else wakeup.wait_readable(fd))


async def receive_batch(
    socket: zmq.Socket, max_messages: int, max_bytes: int = 1 << 62, *, copy: bool = True
) -> list[list]:
    """Wait for at least one multipart message, then take what is queued, up to `max_messages`
    messages or until the batch holds `max_bytes` (one message may exceed it alone). With
    `copy=False` the parts are zmq.Frame objects, which also tell a message's metadata.

    The byte budget matters for large frames: a batch of 64 fresh 200 KB buffers alive at once
    made the allocator map and unmap pages, halving the receive rate (BENCHMARKS.md)."""
    return await _batch(socket, lambda: socket.recv_multipart(zmq.NOBLOCK, copy=copy), max_messages, max_bytes)


async def receive_routed(
    socket: zmq.Socket,
    max_messages: int,
    max_bytes: int = 1 << 62,
    *,
    before_read: Ready | None = None,
    wakeup: Wakeup | None = None,
) -> list[list]:
    """`receive_batch` for a ROUTER, at a third of the cost per message: each message is [routing
    id (bytes), frame (zmq.Frame: its buffer and its connection's metadata), further parts
    (zmq.Frame), if the sender sent more]. `recv_multipart` asks ZMQ_RCVMORE after every part
    and wraps each in a Frame: 10 µs a message here, against 3.3 µs for the routing id as bytes
    and the frame's own `more` flag; in a flood of small frames that was most of the event
    loop's cost of refusing one (BENCHMARKS.md, "Hostile peers"). `before_read` is awaited
    before each attempt to read, after any wait (inbound/process.py tells the node of resets
    then); `wakeup`: the socket is also sent on (`Wakeup`)."""
    return await _batch(socket, lambda: _routed(socket), max_messages, max_bytes, before_read, wakeup)


def _routed(socket: zmq.Socket) -> list:
    routing_id = socket.recv(zmq.NOBLOCK)
    part = socket.recv(zmq.NOBLOCK, copy=False)  # a message arrives whole: its parts are all here
    parts = [routing_id, part]
    while part.more:
        part = socket.recv(zmq.NOBLOCK, copy=False)
        parts.append(part)
    return parts


async def _batch(
    socket: zmq.Socket,
    read: Callable[[], list],
    max_messages: int,
    max_bytes: int,
    before_read: Ready | None = None,
    wakeup: Wakeup | None = None,
) -> list[list]:
    while True:
        if before_read is not None:
            await before_read()
        batch: list[list] = []
        size = 0
        try:
            while len(batch) < max_messages and size < max_bytes:
                parts = read()
                batch.append(parts)
                size += sum(map(len, parts))
        except zmq.Again:
            pass
        if batch:
            await trio.lowlevel.checkpoint()  # a busy socket must not starve other tasks
            return batch
        await wait_for(socket, zmq.POLLIN, wakeup)


async def send_waiting(socket: zmq.Socket, frame: bytes) -> None:
    """Send one frame, waiting (without blocking trio) while the socket's queue is full."""
    while True:
        try:
            socket.send(frame, zmq.NOBLOCK, copy=False)
            return
        except zmq.Again:
            await wait_for(socket, zmq.POLLOUT)
