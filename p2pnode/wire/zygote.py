"""The node's side of its zygote (ingress_process.py `zygote`): one process per node, started
once, that forks an ingress process whenever the node asks for one and tells it when each ends.

A fork of a process that has imported pyzmq and trio and started nothing takes milliseconds; a
new Python takes a second or so on a busy machine. So a node is up sooner (both sockets' processes
come from the one start), a test suite that starts hundreds of nodes does not pay three Python
starts for each, and an inbound socket whose process libzmq aborted is back before the attacker's
next try, however many tries.
"""

from __future__ import annotations

import array
import logging
import math
import os
import signal
import socket
import sys

import trio

from .pipes import socket_pair

__all__ = ["Zygote", "ZygoteError", "describe_exit"]

log = logging.getLogger("p2pnode.ingress")

STOP_WAIT_S = 2.0  # for the zygote to leave once its pipe closes, then it is killed


class ZygoteError(OSError):
    """The zygote could not be started, or is gone."""


def describe_exit(code: int | None) -> str:
    """How a process ended, in words (`code`: as os.waitstatus_to_exitcode gives it)."""
    if code is None:
        return "unknown (its zygote is gone)"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class Zygote:
    def __init__(self) -> None:
        self.process: trio.Process | None = None
        self._socket: trio.socket.SocketType | None = None
        self._buffer = b""
        self._reading = trio.Lock()
        self._forked: list[int] = []  # pids announced and not yet taken, in the order asked for
        self._exits: dict[int, int | None] = {}  # pid -> exit code, once it has ended
        self._live: set[int] = set()

    async def start(self) -> None:
        ours, theirs = socket_pair()
        try:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "p2pnode.wire.ingress_process", str(theirs.fileno())], pass_fds=[theirs.fileno()]
            )
        except OSError as exc:
            ours.close()
            raise ZygoteError(f"cannot start the ingress zygote: {exc}") from None
        finally:
            theirs.close()
        self._socket = trio.socket.from_stdlib_socket(ours)

    async def fork(self, fds: list[int]) -> int:
        """A new ingress process holding `fds` (its control and frames pipe ends; closed here
        once it has them); its pid. Starts the zygote first if there is none or it is gone."""
        try:
            if self._socket is None:
                await self.start()
            await self._socket.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            while not self._forked:
                await self._read_some()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._lost()
            raise ZygoteError(f"the ingress zygote is gone: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)
        pid = self._forked.pop(0)
        self._live.add(pid)
        return pid

    async def wait(self, pid: int, wait_s: float = math.inf) -> int | None:
        """The exit code of process `pid` once it has ended (negative: a signal), killing it
        after `wait_s`; None if the zygote went first and nobody can tell."""
        with trio.move_on_after(wait_s):
            while pid not in self._exits and self._socket is not None:
                try:
                    await self._read_some()
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._lost()
        if pid not in self._exits and self._socket is not None:
            _kill(pid)
            while pid not in self._exits and self._socket is not None:
                await self._read_some()
        self._live.discard(pid)
        return self._exits.pop(pid, None)

    async def _read_some(self) -> None:
        """Read the zygote's next lines, whoever waits for them (one reader at a time)."""
        async with self._reading:
            if self._socket is None:
                return
            if b"\n" not in self._buffer:
                chunk = await self._socket.recv(4096)
                if not chunk:
                    raise ZygoteError("the ingress zygote closed its pipe")
                self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                kind, *numbers = line.decode().split()
                if kind == "P":
                    self._forked.append(int(numbers[0]))
                elif kind == "X":
                    self._exits[int(numbers[0])] = int(numbers[1])

    async def _lost(self) -> None:
        """The zygote is gone: what it forked can no longer be told of; the next fork starts another."""
        log.error("the ingress zygote is gone (%s): starting another", await self._end())
        for pid in self._live:
            self._exits.setdefault(pid, None)

    async def _end(self, wait_s: float = STOP_WAIT_S) -> str:
        socket_, self._socket, process, self.process = self._socket, None, self.process, None
        if socket_ is not None:
            socket_.close()
        if process is None:
            return "never started"
        with trio.CancelScope(shield=True):
            with trio.move_on_after(wait_s):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
        return describe_exit(process.returncode)

    async def close(self) -> None:
        """End the zygote (its children end as their pipes close)."""
        await self._end()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # gone meanwhile: its end is on its way
