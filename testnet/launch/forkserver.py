"""Learning daemons forked from a warm parent: a local testnet's way to skip, for every daemon it
starts, the ~3.5 s of CPU that importing torch (and torch._dynamo, which the first optimizer
pulls in) costs a fresh interpreter. On two cores, ten daemons starting together spent half a
minute importing the same modules.

`ForkServer` starts one `python -m testnet.launch.forkserver`, which imports what every learning daemon
imports and then, per request, forks a child that becomes the daemon: its own process group
(in the server's session, which no terminal controls), its log as stdout and stderr,
PR_SET_PDEATHSIG (it dies with the server, which dies with the launcher), fresh seeds for
`random` and numpy, default signal handlers, then `python -m`'s own entry:
`runpy.run_module(program, run_name="__main__")`. From there it is the same daemon running the
same code as one started with exec; only the imports were done before the fork. Nothing in the
server starts a thread, a trio loop or a ZeroMQ context before forking.

The server reaps its children and reports each exit code (−N for signal N, as `subprocess`
does) on its stdout, one JSON line each; `ForkedDaemon` is the launcher's handle, with the
names and meanings of `subprocess.Popen` that `DaemonProcess` lists. A daemon with a prefix
(a network namespace) is started with exec, as before (testnet/launch/placement.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ForkServer", "ForkedDaemon", "WARM_MODULES", "die_with_parent"]

_PR_SET_PDEATHSIG = 1

# What every learning daemon imports: torch (through the algorithms), torch._dynamo (the first
# optimizer imports it), the daemon itself. A discovery-only daemon imports none of the heavy
# ones, so a local testnet forks only learning daemons (LocalPlacement): a forked child's
# resident memory starts at the server's.
WARM_MODULES = ("torch", "torch._dynamo", "p2pnode_cli", "p2pnode.node", "algorithms.registry", "algorithms.data.setup")
REPLY_DEADLINE_S = 60.0  # the server answers a spawn at once; this long means it is stuck or gone


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """PR_SET_PDEATHSIG: `sig` when the parent dies (runs in a child between fork and exec)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own cleanup still applies


class ForkServerError(RuntimeError):
    """The fork server died or stopped answering."""


class ForkServer:
    """One warm parent for a launcher's daemons; `spawn` returns a `ForkedDaemon`."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "testnet.launch.forkserver"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the launcher alone
            preexec_fn=lambda: die_with_parent(signal.SIGKILL),
        )
        self._buffer = b""
        self._exits: dict[int, int] = {}  # pid → exit code, as reported
        self._replies: list[dict] = []

    def spawn(self, program: Sequence[str], arguments: Sequence[str], log: Path) -> ForkedDaemon:
        request = {"program": list(program), "arguments": list(arguments), "log": str(log)}
        try:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            raise ForkServerError(f"the fork server exited (code {self._process.poll()})") from None
        deadline = time.monotonic() + REPLY_DEADLINE_S
        while not self._replies:
            if not self._read(deadline - time.monotonic()):
                raise ForkServerError(f"the fork server did not answer (exit code {self._process.poll()})")
        return ForkedDaemon(self, self._replies.pop(0)["pid"])

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """`pid`'s exit code once the server has reported it, waiting at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while pid not in self._exits:
            if not self._read(deadline - time.monotonic()):
                return None
        return self._exits[pid]

    def _read(self, timeout: float) -> bool:
        """Take what the server has written within `timeout` seconds; False if nothing came."""
        out = self._process.stdout
        ready, _, _ = select.select([out], [], [], max(0.0, timeout))
        if not ready:
            return False
        chunk = os.read(out.fileno(), 65536)
        if not chunk:  # the server is gone: so are the children it reaped; none can report now
            raise ForkServerError(f"the fork server exited (code {self._process.wait()})")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "exited" in message:
                self._exits[message["exited"]] = message["code"]
            else:
                self._replies.append(message)
        return True

    def close(self) -> None:
        """Stop the server (its stdin closed: it exits once its children have); SIGKILL after 5 s."""
        if self._process.stdin:
            self._process.stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()


class ForkedDaemon:
    """A daemon the fork server started: `subprocess.Popen`'s pid, returncode, poll, wait and
    send_signal, and `kill_group` (testnet/launch/placement.py's `DaemonProcess`)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, math.inf if timeout is None else timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"daemon {self.pid}", timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a reaped pid: the system may have given it to another process
            os.kill(self.pid, sig)

    def kill_group(self) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone already


# --- the server ------------------------------------------------------------------------------


def serve() -> None:
    """Import WARM_MODULES, then fork a daemon per request line on stdin until stdin closes;
    report each pid, then each exit code, one JSON line each on stdout."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing printed by accident ends up in a reply
    children: set[int] = set()
    requests, pending = sys.stdin.buffer.raw, b""
    open_ = True
    while open_ or children:
        ready, _, _ = select.select([requests] if open_ else [], [], [], 0.05)
        if ready:
            chunk = os.read(requests.fileno(), 65536)
            open_ = bool(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                pid = _fork(json.loads(line), replies)
                children.add(pid)
                _reply(replies, {"pid": pid})
        for pid, code in _reaped(children):
            children.discard(pid)
            _reply(replies, {"exited": pid, "code": code})


def _reply(fd: int, message: dict) -> None:
    os.write(fd, json.dumps(message).encode() + b"\n")


def _reaped(children: set[int]) -> list[tuple[int, int]]:
    """The children that have exited, each with its exit code; reaped."""
    done = []
    while len(done) < len(children):
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        done.append((pid, os.waitstatus_to_exitcode(status)))
    return done


def _fork(request: dict, replies: int) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        with contextlib.suppress(OSError):  # the child may have done it first (see _become_daemon)
            os.setpgid(pid, pid)  # before the launcher hears of it, so `kill_group` reaches it
        return pid
    code = 1
    try:  # the child: it never returns into the server's loop
        os.close(replies)
        code = _become_daemon(request["program"], request["arguments"], Path(request["log"]))
    except BaseException:  # a child's failure is its exit code, as in python -m
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _become_daemon(program: Sequence[str], arguments: Sequence[str], log: Path) -> int:
    """In the forked child: what `python -m PROGRAM ARGUMENTS` with its output appended to `log`
    would be in a process group of its own; returns its exit code."""
    import logging
    import random
    import runpy

    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # its own process group, set by both sides of the fork (no race)
    die_with_parent(signal.SIGTERM)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A fresh interpreter seeds these from the OS; forked children would share the server's.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    module, *extra = program
    sys.argv = [module, *extra, *arguments]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    logging.shutdown()
    return code


def _exit_code(code: object) -> int:
    """What the interpreter makes of `SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve()
