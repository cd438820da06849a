"""Connections reset by their other end, seen when the kernel sees them: the suspects of
libzmq's abort (supervisor.py).

The stall-reset attack aborts libzmq only through a connection its client reset (a TCP RST)
while the connection's queue was full; honest peers end theirs with a FIN (libzmq closes its
sockets that way, and so does the kernel for a process that dies). So a reset just before an
abort names the connection that caused it, and nobody who merely connected or reconnected then
is suspected (zap.py `Connections.forget_all`). libzmq shows nothing of a reset on a connection
whose engine has stopped reading (its queue full): each accepted connection's descriptor is
watched here instead, by epoll in a thread of its own, for the error and hang-up a reset raises,
and TCP_INFO tells a reset (the socket back in state CLOSE at once) from this node's own
shutdowns (buffers.py: a shutdown leaves it closing, not closed). That thread can be late (it
waits for the interpreter): libzmq aborts only once a read from the socket lets the engine read
again, so before each read the ingress process also looks itself (`ResetWatch.take`) and tells
the node of every reset first. Untold, an abort would be traced to no one (it was, 1 in 15
times, on a loaded machine).

Linux only (epoll, TCP_INFO's layout); elsewhere nothing is watched, and an abort is traced to
no one.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable

__all__ = ["ResetWatch", "was_reset"]

log = logging.getLogger("p2pnode.ingress")

_TCP_CLOSE = 7  # tcpi_state (linux/tcp_states.h) of a connection reset by its other end
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_EPOLL = getattr(select, "epoll", None)


def was_reset(fd: int) -> bool:
    """Whether the TCP connection on `fd` was reset (its state CLOSE while the descriptor is
    open); False if `fd` is no TCP socket, or is gone."""
    if _TCP_INFO is None:
        return False
    try:
        wrapped = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        return wrapped.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)[0] == _TCP_CLOSE
    except OSError:
        return False
    finally:
        wrapped.detach()  # libzmq's descriptor: never closed here


class ResetWatch:
    """Watches descriptors (`watch`, `forget`) for a reset. Each reset is claimed once and kept
    until `take` hands it over. Its own thread claims them as the kernel reports them and then
    calls `found()`, to wake whoever takes them; `take` also looks itself, so a reset the kernel
    had before the call is never missed while that thread waits to run (the node reads nothing
    more from the socket before it heard of every reset: process.py). Use as a context
    manager."""

    def __init__(self, found: Callable[[], None]) -> None:
        self.found = found
        self._epoll = _EPOLL() if _EPOLL is not None else None  # one-shot, for the thread
        self._level = _EPOLL() if _EPOLL is not None else None  # level-triggered, for `take`
        self._peers: dict[int, tuple] = {}
        self._claimed: list[tuple[int, tuple]] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="p2pnode-resets", daemon=True)

    def __enter__(self) -> ResetWatch:
        if self._epoll is not None:
            self._epoll.register(self._wake_r, select.EPOLLIN)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        for epoll in (self._epoll, self._level):
            if epoll is not None:
                epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def watch(self, fd: int, peer: tuple) -> None:
        """An accepted connection, `peer` its remote end."""
        if self._epoll is None:
            return
        errors = select.EPOLLERR | select.EPOLLHUP
        with self._lock:
            self._peers[fd] = peer
            for epoll, flags in ((self._epoll, errors | select.EPOLLONESHOT), (self._level, errors)):
                try:
                    epoll.register(fd, flags)
                except FileExistsError:  # a descriptor reused before its old registration was dropped
                    epoll.modify(fd, flags)
                except OSError:
                    self._peers.pop(fd, None)  # already closed
                    return

    def forget(self, fd: int) -> None:
        """A connection that ended (libzmq closed its descriptor: epoll forgot it then)."""
        with self._lock:
            self._peers.pop(fd, None)

    def take(self) -> list[tuple[int, tuple]]:
        """The resets claimed since the last call, as (descriptor, remote end), after claiming
        those the kernel holds now."""
        if self._level is not None:
            for fd, _ in self._level.poll(0):
                self._claim(fd)
        with self._lock:
            claimed, self._claimed = self._claimed, []
        return claimed

    def _claim(self, fd: int) -> bool:
        """Whether `fd` was reset and is claimed now (by this call, not before)."""
        with self._lock:
            peer = self._peers.get(fd)
            if peer is None or not was_reset(fd):
                return False  # claimed already, forgotten, or shut by this node: not a reset
            del self._peers[fd]
            self._claimed.append((fd, peer))
            try:
                self._level.unregister(fd)  # it stays in error, and would come back each look
            except OSError:
                pass
        return True

    def _run(self) -> None:
        while True:
            try:
                events = self._epoll.poll()
            except OSError:
                return  # closed
            if any(fd == self._wake_r for fd, _ in events):
                return
            if sum(self._claim(fd) for fd, _ in events):
                try:
                    self.found()
                except Exception:  # the process is going: nobody left to tell
                    log.debug("resets went unreported", exc_info=True)
