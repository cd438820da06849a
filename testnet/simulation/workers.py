"""Hosts in worker processes on this machine: the `processes` engine of testnet/simulation/hosting.py.

Each worker is a child process that builds its host (testnet/simulation/host.py) and answers the
exchange's commands over a pipe. It is forked where that is safe (`start_method`): it then
starts in a fraction of a second with torch already imported, where a spawned interpreter takes
seconds to import torch again. Every wait is bounded: a worker that dies, raises
or does not answer within `timeout_s` stops the run with an error that names it (and the node,
where a node raised), and the pool is torn down whatever happened.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from .exchange import Arguments
from .host import Host
from .shard import NodeFailed, SimulationError
from .spec import SimulationSpec

__all__ = ["ProcessHosts"]

STOP_GRACE_S = 5.0  # how long a worker may take to exit once asked, before it is terminated


class ProcessHosts:
    def __init__(
        self, spec: SimulationSpec, blocks: Sequence[tuple[int, ...]], *, threads: int, timeout_s: float
    ) -> None:
        """One worker per block of node indices, each with `threads` torch threads."""
        self.blocks = list(blocks)
        self.timeout_s = timeout_s
        self._workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        self._posted: list[deque[str]] = [deque() for _ in self.blocks]  # per worker: posted, answer unread
        context = multiprocessing.get_context(start_method(threads))
        try:
            for h, block in enumerate(self.blocks):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=serve, args=(theirs, spec, block, threads), name=f"p2pnode-host-{h}", daemon=True
                )
                process.start()
                theirs.close()
                self._workers.append((process, ours))
            self._gather("start", range(len(self.blocks)))  # each worker answers once it has built its nodes
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ProcessHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, args: Sequence[Arguments]) -> list[Any]:
        return self._gather(method, self._send(method, args))

    def post(self, method: str, args: Sequence[Arguments]) -> None:
        for h in self._send(method, args):
            self._posted[h].append(method)

    def _send(self, method: str, args: Sequence[Arguments]) -> list[int]:
        """Send `method` to the workers with arguments; returns which."""
        sent = []
        for h, ((_, conn), arguments) in enumerate(zip(self._workers, args, strict=True)):
            if arguments is None:
                continue
            try:
                conn.send((method, arguments))
            except OSError:  # its end of the pipe is closed: it died since the last command
                raise SimulationError(f"{self._name(h)} is gone ({method}): {self._exit(h)}") from None
            sent.append(h)
        return sent

    def close(self) -> None:
        """Ask every worker to stop, and end those that do not within STOP_GRACE_S."""
        for _, conn in self._workers:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        for process, conn in self._workers:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(STOP_GRACE_S)
            conn.close()
        self._workers = []

    def _gather(self, method: str, called: Iterable[int]) -> list[Any]:
        """The answers of the `called` workers to `method`, in worker order (None for the others),
        after those to what was posted to them before; raises at the first failure."""
        called, answers = list(called), {}
        deadline = time.monotonic() + self.timeout_s
        while len(answers) < len(called):
            waiting = [h for h in called if h not in answers]
            handles = [self._workers[h][1] for h in waiting] + [self._workers[h][0].sentinel for h in waiting]
            if not wait(handles, timeout=max(0.0, deadline - time.monotonic())):
                late = ", ".join(self._name(h) for h in waiting)
                raise SimulationError(f"no answer to {method} within {self.timeout_s:g} s from {late}")
            for h in waiting:
                process, conn = self._workers[h]
                while h not in answers and conn.poll():
                    posted = self._posted[h]
                    value = self._answer(h, posted[0] if posted else method, conn)
                    if posted:
                        posted.popleft()
                    else:
                        answers[h] = value
                if h not in answers and not process.is_alive() and not conn.poll():
                    raise SimulationError(f"{self._name(h)} died during {method}: {self._exit(h)}")
        return [answers.get(h) for h in range(len(self._workers))]

    def _answer(self, h: int, method: str, conn: Connection) -> Any:
        try:
            status, value = conn.recv()
        except (EOFError, OSError):
            raise SimulationError(f"{self._name(h)} died during {method}: {self._exit(h)}") from None
        if status == "node":
            raise NodeFailed(f"{value}; it ran in {self._name(h)}")
        if status == "error":
            raise SimulationError(f"{self._name(h)} failed in {method}: {value}")
        return value

    def _name(self, h: int) -> str:
        block = self.blocks[h]
        return f"worker {h} (nodes {block[0]}–{block[-1]})"

    def _exit(self, h: int) -> str:
        process = self._workers[h][0]
        process.join(1.0)
        code = process.exitcode
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def start_method(threads: int) -> str:
    """`fork` where a child can safely inherit this process, else `spawn` (a fresh interpreter).

    Forked, a worker is up in ~0.2 s; spawned, it imports torch again (~1.2 s on 2 cores) and
    torch._dynamo with its first optimiser (~1.3 s more). Forking is safe on Linux when this
    process holds no CUDA context (a forked child cannot use it) and each worker runs one torch
    thread, as PyTorch's DataLoader workers do: no child enters an OpenMP pool it inherited
    half-used. Anything else is spawned."""
    import torch

    if sys.platform != "linux" or threads != 1 or torch.cuda.is_initialized():
        return "spawn"
    # The first optimiser imports torch._dynamo: once here rather than in every worker.
    import torch._dynamo

    return "fork"


def serve(conn: Connection, spec: SimulationSpec, block: tuple[int, ...], threads: int) -> None:
    """A worker's life: build the host, then answer commands until told to stop; the first
    error is sent back and ends the worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the simulator to handle
    try:
        host = Host(spec, block, threads, worker=True)
        conn.send(("ok", None))
        while (command := conn.recv()) is not None:
            method, arguments = command
            conn.send(("ok", getattr(host, method)(*arguments)))
    except EOFError:  # the simulator is gone
        return
    except NodeFailed as failed:
        conn.send(("node", str(failed)))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
