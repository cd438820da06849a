"""The local control endpoint: a Unix socket in the node's data directory.

Local-only by construction: no network address, the socket file is mode 0600 inside a 0700
directory, so only the node's own user can ask for status, a stop or predictions. One request
per connection: a JSON object on one line in (at most `max_request_bytes`, received within
_REQUEST_DEADLINE_S), a JSON object on one line out.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

__all__ = ["serve_control", "request", "ControlError", "NotRunning", "MAX_REQUEST_BYTES"]

MAX_REQUEST_BYTES = 4096
_REQUEST_DEADLINE_S = 5.0
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024

Handler = Callable[[dict], Awaitable[dict]]


class ControlError(Exception):
    """The node could not be reached or did not answer; the message says what to do."""


class NotRunning(ControlError):
    """Nothing listens on the control socket: no node runs with this configuration."""


async def serve_control(
    path: Path, handle: Handler, *, max_request_bytes: int = MAX_REQUEST_BYTES, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Serve requests on `path` until cancelled; the socket file is removed on the way out.

    The caller holds the data-directory lock, so a socket file left by a crashed node is
    stale and safe to replace."""
    path.unlink(missing_ok=True)
    listener_socket = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await listener_socket.bind(str(path))
        os.chmod(path, 0o600)
        listener_socket.listen(16)
        listener = trio.SocketListener(listener_socket)
    except BaseException:
        listener_socket.close()
        raise
    try:
        async with listener:
            task_status.started()
            await trio.serve_listeners(lambda stream: _serve_one(stream, handle, max_request_bytes), [listener])
    finally:
        path.unlink(missing_ok=True)


async def _serve_one(stream: trio.SocketStream, handle: Handler, max_request_bytes: int) -> None:
    """Receive within the deadline, answer (a handler's work is bounded by what it accepts),
    send within the deadline."""
    async with stream:
        data = None
        with trio.move_on_after(_REQUEST_DEADLINE_S):
            data = await _receive_line(stream, max_request_bytes)
        if data is None:
            return  # too slow: hang up
        try:
            if len(data) > max_request_bytes:
                raise ValueError(f"longer than {max_request_bytes} bytes")
            request = json.loads(data.split(b"\n", 1)[0])
            if not isinstance(request, dict):
                raise ValueError("expected a JSON object on one line")
            response = await handle(request)
        except ValueError as exc:
            response = {"ok": False, "error": f"bad request: {exc}"}
        with trio.move_on_after(_REQUEST_DEADLINE_S):
            try:
                await stream.send_all(json.dumps(response).encode() + b"\n")
            except trio.BrokenResourceError:
                pass  # the client went away


async def _receive_line(stream: trio.SocketStream, max_request_bytes: int) -> bytes:
    """Up to the first newline, the end of the stream, or one chunk past `max_request_bytes`."""
    data = bytearray()
    while len(data) <= max_request_bytes:
        chunk = await stream.receive_some(1 << 16)
        if not chunk:
            break
        data += chunk
        if b"\n" in chunk:
            break
    return bytes(data)


def request(path: Path, command: str, timeout: float = _REQUEST_DEADLINE_S, **arguments: Any) -> dict:
    """Blocking client for the CLI: send one command (with its arguments), return the node's answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        try:
            client.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotRunning(f"no node is running with this configuration (nothing listens at {path})") from None
        except OSError as exc:
            raise ControlError(f"cannot reach the node at {path}: {exc.strerror or exc}") from None
        try:
            client.sendall(json.dumps({"command": command, **arguments}).encode() + b"\n")
            data = bytearray()
            while not data.endswith(b"\n"):
                chunk = client.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
                if len(data) > _MAX_RESPONSE_BYTES:
                    raise ControlError("the node's answer is too large")
        except TimeoutError:
            raise ControlError(f"the node at {path} did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise ControlError(f"lost the connection to the node at {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(data)
    except ValueError:
        raise ControlError(f"the node at {path} sent an unreadable answer") from None
