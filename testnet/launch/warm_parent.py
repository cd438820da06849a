"""Learning daemons forked from a warm parent: a local testnet's way to skip, for every daemon it
starts, the ~3.5 s of CPU that importing torch (and torch._dynamo, which the first optimizer
pulls in) costs a fresh interpreter. On two cores, ten daemons starting together spent half a
minute importing the same modules.

`WarmParent` starts one `python -m testnet.launch.warm_parent`, a fork server (p2pnode/forkserver.py:
the mechanism, shared with the node's ingress processes) that imports what every learning daemon
imports and then, per request, forks a child that becomes the daemon: its own process group (in
the server's session, which no terminal controls), its log as stdout and stderr,
PR_SET_PDEATHSIG (it dies with the server, which dies with the launcher), fresh seeds for
`random` and numpy, default signal handlers, then `python -m`'s own entry:
`runpy.run_module(program, run_name="__main__")`. From there it is the same daemon running the
same code as one started with exec; only the imports were done before the fork. Nothing in the
server starts a thread, a trio loop or a ZeroMQ context before forking.

The server reaps its children and tells each exit code (−N for signal N, as `subprocess` does);
`ForkedDaemon` is the launcher's handle, with the names and meanings of `subprocess.Popen` that
`DaemonProcess` lists. A daemon with a prefix (a network namespace) is started with exec, as
before (testnet/launch/placement.py).
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from p2pnode.forkserver import ForkServer, die_with_parent, serve

__all__ = ["WarmParent", "ForkedDaemon", "WARM_MODULES", "DISCOVERY_MODULES"]

# What every learning daemon imports: torch (through the algorithms), torch._dynamo (the first
# optimizer imports it), the daemon itself. A discovery-only daemon imports none of the heavy
# ones: it is forked from a parent that imported the daemon alone, so that a forked child's
# resident memory, which starts at its server's, is what an exec'd daemon's would be.
WARM_MODULES = ("torch", "torch._dynamo", "p2pnode_cli", "p2pnode.node", "algorithms.registry", "algorithms.data.setup")
DISCOVERY_MODULES = ("p2pnode_cli", "p2pnode.node")


_this_thread = threading.local()


class WarmParent:
    """One warm parent for a launcher's daemons, learning ones or (`learning=False`) those that
    only run discovery; `spawn` returns a `ForkedDaemon`."""

    def __init__(self, learning: bool = True) -> None:
        self.server = ForkServer("testnet.launch.warm_parent", () if learning else ("discovery",))

    @classmethod
    def shared(cls, learning: bool = True) -> WarmParent:
        """This thread's warm parent of that kind, started by its first use and again once it is
        gone: a process that runs testnet after testnet (a benchmark, a test suite) imports torch
        once for all of them. It dies with the thread that started it (PR_SET_PDEATHSIG); a thread
        has its own, as one server answers one client."""
        parents = _this_thread.__dict__.setdefault("parents", {})
        parent = parents.get(learning)
        if parent is None or parent.server.process.poll() is not None:
            parent = parents[learning] = cls(learning)
            atexit.register(parent.close)
        return parent

    def spawn(self, program: Sequence[str], arguments: Sequence[str], log: Path) -> ForkedDaemon:
        request = {"program": list(program), "arguments": list(arguments), "log": str(log)}
        return ForkedDaemon(self.server, self.server.fork(request))

    def close(self) -> None:
        """Stop the server (it leaves once its children have); SIGKILL after 5 s."""
        self.server.close()


class ForkedDaemon:
    """A daemon the warm parent started: `subprocess.Popen`'s pid, returncode, poll, wait and
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


def _become_daemon(request: dict, fds: list[int]) -> int:
    """In the forked child (a process group of its own already): what `python -m PROGRAM
    ARGUMENTS` with its output appended to the log would be; returns its exit code."""
    import logging
    import random
    import runpy

    die_with_parent(signal.SIGTERM)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    out = os.open(Path(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
    module, *extra = request["program"]
    sys.argv = [module, *extra, *request["arguments"]]
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


def main(argv: list[str] | None = None) -> None:
    """The server: import WARM_MODULES (DISCOVERY_MODULES after `discovery`), then fork a daemon
    per request until the launcher closes its end and every daemon has ended."""
    import importlib

    channel_fd, *kind = argv or sys.argv[1:]
    for name in DISCOVERY_MODULES if kind == ["discovery"] else WARM_MODULES:
        importlib.import_module(name)
    serve(int(channel_fd), _become_daemon, own_groups=True, wait_for_children=True)


if __name__ == "__main__":
    main()
