"""Messages between the node and its ingress process (supervisor.py, process.py): msgpack values, each behind
its length, over a stream of a local socket pair that only the two ends hold.

Both ends are our own code, but the bound still holds: a message longer than the stream's
`max_bytes` ends the stream (`PipeError`) instead of being buffered, so a confused or dying
peer cannot make the other end allocate without limit.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack
import trio

__all__ = ["MessagePipe", "PipeError", "socket_pair"]

_LENGTH = struct.Struct(">I")
_READ_CHUNK = 1 << 20


class PipeError(Exception):
    """The other end closed the pipe, or sent something that is not a message of it."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of stream sockets (the node's end, the child's end); neither is
    inherited by other children unless passed on explicitly."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.set_inheritable(False)
    theirs.set_inheritable(False)
    return ours, theirs


class MessagePipe:
    """One end of a pipe: `send(value)` and `receive()` whole messages, one task each way."""

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self.max_bytes = max_bytes
        self._buffer = bytearray()

    async def send(self, value: Any) -> None:
        payload = msgpack.packb(value, use_bin_type=True)
        await self.stream.send_all(_LENGTH.pack(len(payload)) + payload)

    async def receive(self) -> Any:
        """The next message; PipeError once the other end is gone."""
        header = await self._read(_LENGTH.size)
        (length,) = _LENGTH.unpack(header)
        if length > self.max_bytes:
            raise PipeError(f"a message of {length} bytes on a pipe bounded at {self.max_bytes}")
        try:
            return msgpack.unpackb(await self._read(length), raw=False, strict_map_key=False)
        except (ValueError, msgpack.ExtraData) as exc:
            raise PipeError(f"not a message: {exc}") from None

    async def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            try:
                chunk = await self.stream.receive_some(max(_READ_CHUNK, count - len(self._buffer)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise PipeError(f"the pipe broke: {exc}") from None
            if not chunk:
                raise PipeError("the other end closed the pipe")
            self._buffer += chunk
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def aclose(self) -> None:
        await self.stream.aclose()
