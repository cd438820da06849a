"""Children forked from a warm parent: a server process that has imported what its children need
and started nothing (no thread, no trio run, no ZeroMQ context: a fork is then safe) forks one
child per request. A fork takes milliseconds; a new Python a second or so on a busy machine, and
several more for one that imports torch.

One mechanism, two users:
- a node's ingress processes (p2pnode/wire/inbound/supervisor.py, `python -m
  p2pnode.wire.inbound.process`), driven from the node's trio loop (`TrioForkServer`): a node is
  up sooner, a test suite that starts hundreds of nodes does not pay three Python starts for each,
  and an inbound socket whose process libzmq aborted is back before the attacker's next try;
- a local testnet's learning daemons (testnet/launch/warm_parent.py), driven from a plain
  launcher (`ForkServer`): each skips the seconds of importing torch.

A server is `python -m MODULE FD`: the module imports what its children need, then calls
`serve(FD, child)`. FD is the server's end of a stream socket pair whose other end the client
holds, and on it:
- the client sends a request: a JSON object on a line of its own, with the descriptors the child
  is to hold attached (SCM_RIGHTS); one at a time, each answered before the next is sent;
- the server forks; the child runs `child(request, fds)`, whose return is its exit code (an
  exception: 1, its traceback on stderr), and never returns into the server's loop; the server
  answers {"pid": PID};
- when a child has ended, the server says {"exited": PID, "code": CODE} (negative: the signal
  that ended it, as `subprocess` says it), a line each.
The server ends when the client closes its end (with `wait_for_children`, once its children have
ended too).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import logging
import math
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

import trio

__all__ = ["ForkServer", "ForkServerError", "TrioForkServer", "describe_exit", "die_with_parent", "serve"]

log = logging.getLogger("p2pnode.forkserver")

MAX_REQUEST_BYTES = 1 << 16
MAX_FDS = 8  # descriptors one request may pass
REPLY_DEADLINE_S = 60.0  # a server answers a fork at once; this long means it is stuck or gone
STOP_WAIT_S = 2.0  # for a server to leave once its end closes, then it is killed
_PR_SET_PDEATHSIG = 1

Child = Callable[[dict, list[int]], int]  # what a forked child runs: (request, fds) -> exit code


class ForkServerError(OSError):
    """The fork server could not be started, or is gone, or stopped answering."""


def describe_exit(code: int | None) -> str:
    """How a process ended, in words (`code`: as os.waitstatus_to_exitcode gives it)."""
    if code is None:
        return "unknown (its fork server is gone)"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """PR_SET_PDEATHSIG: `sig` when the parent dies (runs in a child, after fork)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's own cleanup still applies


# --- the server ------------------------------------------------------------------------------


def serve(channel_fd: int, child: Child, *, own_groups: bool = False, wait_for_children: bool = False) -> NoReturn:
    """Fork a child running `child` per request on `channel_fd` until the client closes it (see
    the module's docstring), then leave. `own_groups`: each child in a process group of its own,
    set on both sides of the fork, so that the pid the client hears of is already its group's.
    Call it with everything the children need imported, and nothing started."""
    _Server(socket.socket(fileno=channel_fd), child, own_groups).run(wait_for_children)
    # Without tearing the interpreter down: the server holds nothing to clean up, and unloading
    # what it imported costs torch's warm parent ~0.75 s of CPU at the end of every testnet.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _Server:
    def __init__(self, channel: socket.socket, child: Child, own_groups: bool) -> None:
        self.channel, self.child, self.own_groups = channel, child, own_groups
        self.open = True  # until the client closes its end
        self.children: set[int] = set()
        self.woken, self._wake = os.pipe()
        os.set_blocking(self._wake, False)
        signal.set_wakeup_fd(self._wake)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe above

    def run(self, wait_for_children: bool) -> None:
        while self.open or (wait_for_children and self.children):
            readable, _, _ = select.select([self.channel, self.woken] if self.open else [self.woken], [], [])
            if self.woken in readable:
                os.read(self.woken, 4096)
            if self.channel in readable and (request := self._request()) is not None:
                pid = self._fork(*request)
                self.children.add(pid)
                self._reply({"pid": pid})
            for pid, code in self._reaped():
                self._reply({"exited": pid, "code": code})

    def _request(self) -> tuple[dict, list[int]] | None:
        """The client's next request and the descriptors sent with it; None once it is gone."""
        data, fds, _, _ = socket.recv_fds(self.channel, MAX_REQUEST_BYTES, MAX_FDS)
        while data and not data.endswith(b"\n"):  # the rest of a request longer than one read
            more = self.channel.recv(MAX_REQUEST_BYTES)
            data = data + more if more else b""
        if not data:
            self.open = False
            for fd in fds:
                os.close(fd)
            return None
        return json.loads(data), list(fds)

    def _fork(self, request: dict, fds: list[int]) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_child(request, fds)
        for fd in fds:
            os.close(fd)
        if self.own_groups:
            with contextlib.suppress(OSError):  # the child may have done it first
                os.setpgid(pid, pid)
        return pid

    def _become_child(self, request: dict, fds: list[int]) -> NoReturn:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.channel.close()
            os.close(self.woken)
            os.close(self._wake)
            if self.own_groups:
                with contextlib.suppress(OSError):
                    os.setpgid(0, 0)
            code = self.child(request, fds)
        except BaseException:  # a child's failure is its exit code, as in python -m
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _reaped(self) -> list[tuple[int, int]]:
        """The children that have ended, each with its exit code; reaped."""
        done = []
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.children.discard(pid)
            done.append((pid, os.waitstatus_to_exitcode(status)))
        return done

    def _reply(self, message: dict) -> None:
        if self.open:
            try:
                self.channel.sendall(json.dumps(message).encode() + b"\n")
            except OSError:
                self.open = False  # the client is gone: nobody to tell


# --- the clients ------------------------------------------------------------------------------


class _Replies:
    """What a server has said: the pids it forked, in the order asked for, and exit codes."""

    def __init__(self) -> None:
        self.buffer = b""
        self.forked: list[int] = []
        self.exits: dict[int, int | None] = {}  # pid -> exit code, once it has ended

    def feed(self, chunk: bytes) -> None:
        *lines, self.buffer = (self.buffer + chunk).split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "pid" in message:
                self.forked.append(message["pid"])
                self.exits.pop(message["pid"], None)  # an earlier child's, whose pid the system gave again
            else:
                self.exits[message["exited"]] = message["code"]


def _encode(request: dict) -> bytes:
    data = json.dumps(request).encode() + b"\n"
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError(f"a fork request of {len(data)} bytes (at most {MAX_REQUEST_BYTES})")
    return data


def _rights(fds: Sequence[int]) -> list:
    """The ancillary data that passes `fds` (SCM_RIGHTS); none for no descriptor."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []


def _channel() -> tuple[socket.socket, socket.socket, list[str]]:
    """A connected pair (the client's end, the server's) and the server's arguments after
    `python -m MODULE`; neither end is inherited by other children unless passed on."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.set_inheritable(False)
    theirs.set_inheritable(False)
    return ours, theirs, [str(theirs.fileno())]


class ForkServer:
    """A fork server driven from plain code (a launcher), in a session of its own (a terminal's
    Ctrl-C reaches the launcher alone) and killed when the launcher dies: `fork`, `exit_code`."""

    def __init__(self, module: str, arguments: Sequence[str] = ()) -> None:
        """`python -m MODULE FD ARGUMENTS`."""
        ours, theirs, channel = _channel()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *channel, *arguments],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=lambda: die_with_parent(signal.SIGKILL),
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server {module}: {exc}") from None
        finally:
            theirs.close()
        self._channel = ours
        self._replies = _Replies()

    def fork(self, request: dict, fds: Sequence[int] = ()) -> int:
        """A new child for `request`, holding `fds` (closed here once it has them); its pid."""
        try:
            data = _encode(request)
            sent = self._channel.sendmsg([data], _rights(fds))
            self._channel.sendall(data[sent:])
        except OSError:
            raise ForkServerError(f"the fork server exited (code {self.process.poll()})") from None
        finally:
            for fd in fds:
                os.close(fd)
        deadline = time.monotonic() + REPLY_DEADLINE_S
        while not self._replies.forked:
            if not self._read(deadline - time.monotonic()):
                raise ForkServerError(f"the fork server did not answer (exit code {self.process.poll()})")
        return self._replies.forked.pop(0)

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """`pid`'s exit code once the server has told it, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while pid not in self._replies.exits:
            if not self._read(deadline - time.monotonic()):
                return None
        return self._replies.exits[pid]

    def _read(self, timeout: float) -> bool:
        """Take what the server has said within `timeout` seconds; False if nothing came."""
        ready, _, _ = select.select([self._channel], [], [], None if timeout == math.inf else max(0.0, timeout))
        if not ready:
            return False
        try:
            chunk = self._channel.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:  # the server is gone: so are the children it reaped; none can report now
            raise ForkServerError(f"the fork server exited (code {self.process.wait()})")
        self._replies.feed(chunk)
        return True

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the server (its end closed, it leaves: with `wait_for_children`, once its children
        have); SIGKILL after `wait_s`."""
        self._channel.close()
        try:
            self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class TrioForkServer:
    """A fork server driven from trio (a node): `fork`, `wait`, `close`. Started by the first
    fork, and again by the next fork after it is gone."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.process: trio.Process | None = None
        self._socket: trio.socket.SocketType | None = None
        self._replies = _Replies()
        self._reading = trio.Lock()
        self._asking = trio.Lock()  # one request at a time (the module's docstring)
        self._live: set[int] = set()

    async def start(self) -> None:
        ours, theirs, arguments = _channel()
        try:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", self.module, *arguments], pass_fds=[theirs.fileno()]
            )
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start the fork server {self.module}: {exc}") from None
        finally:
            theirs.close()
        self._socket = trio.socket.from_stdlib_socket(ours)
        self._replies.buffer, self._replies.forked = b"", []

    async def fork(self, request: dict, fds: Sequence[int] = ()) -> int:
        """A new child for `request`, holding `fds` (closed here once it has them); its pid.
        Starts the server first if there is none or it is gone."""
        try:
            async with self._asking:
                if self._socket is None:
                    await self.start()
                data = _encode(request)
                sent = await self._socket.sendmsg([data], _rights(fds))
                while sent < len(data):
                    sent += await self._socket.send(data[sent:])
                while not self._replies.forked:
                    await self._read_some()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._lost()
            raise ForkServerError(f"the fork server {self.module} is gone: {exc}") from None
        finally:
            for fd in fds:
                os.close(fd)
        pid = self._replies.forked.pop(0)
        self._live.add(pid)
        return pid

    async def wait(self, pid: int, kill_after_s: float = math.inf) -> int | None:
        """The exit code of child `pid` once it has ended (negative: a signal), killing it after
        `kill_after_s`; None if the server went first and nobody can tell."""
        exits = self._replies.exits
        with trio.move_on_after(kill_after_s):
            while pid not in exits and self._socket is not None:
                try:
                    await self._read_some()
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._lost()
        if pid not in exits and self._socket is not None:
            _kill(pid)
            while pid not in exits and self._socket is not None:
                await self._read_some()
        self._live.discard(pid)
        return exits.pop(pid, None)

    async def _read_some(self) -> None:
        """Read what the server says next, whoever waits for it (one reader at a time)."""
        async with self._reading:
            if self._socket is None:
                return
            chunk = await self._socket.recv(4096)
            if not chunk:
                raise ForkServerError(f"the fork server {self.module} closed its end")
            self._replies.feed(chunk)

    async def _lost(self) -> None:
        """The server is gone: what it forked can no longer be told of; the next fork starts another."""
        log.error("the fork server %s is gone (%s): starting another", self.module, await self._end())
        for pid in self._live:
            self._replies.exits.setdefault(pid, None)

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
        """End the server (its children end as their own pipes close)."""
        await self._end()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # gone meanwhile: its end is on its way
