"""A bound on the bytes ZeroMQ holds for inbound connections, which ZeroMQ itself does not have.

libzmq bounds one frame (ZMQ_MAXMSGSIZE) and the complete messages queued per connection
(RCVHWM), but not a multipart message still being received: it keeps every part until the last
one arrives, so a connection that sends parts and never the last makes it hold all of them (one
connection sending 60 KB parts filled 300 MB within a second). ZeroMQ shows nothing of an
incomplete message, so the kernel is asked instead: TCP_INFO counts the bytes each connection
received. What the inbound connections received, less what the node read from the socket, less
an allowance for framing, heartbeats and handshakes (generous, so the estimate errs low), is what
libzmq holds. Above the socket's bound (`[transport].max_public_buffered_bytes`, tight: strangers
connect there and its frames are small; `max_peers_buffered_bytes`, with room for models) the
connection that received the most since the last check is shut down, which makes libzmq drop
it and free its parts, and it is counted: whoever pumps the bytes in is the one the flood comes
from.

Linux only (TCP_INFO's layout); elsewhere, and for non-TCP endpoints, nothing is watched.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from ...memory import PAGE_BYTES, resident_bytes, trim_now
from .silence import SILENT, SilentConnections

__all__ = [
    "BufferEstimate",
    "GrowthAlarm",
    "bytes_received",
    "tcp_info",
    "shut_down",
    "watch_buffers",
    "SHED",
    "ENDED",
    "PER_CONNECTION_BYTES",
]

log = logging.getLogger("p2pnode.buffers")

SHED = "shed_buffered"  # Metrics.connections: a connection shut down for what libzmq held for it
ENDED = "shut_ended"  # Metrics.connections: a stranger's connection that ended, shut with its backlog

# A connection: its descriptor and the peer it was accepted from. Descriptors are reused once
# libzmq closes them; the pair names one TCP connection.
Connection = tuple[int, tuple]

# Allowances (bytes) for what arrives on a connection without ever being read as a frame.
FRAME_OVERHEAD = 64  # ZMTP frame header (≤ 9) and CURVE's MESSAGE box (≤ 33) per message read
IDLE_BYTES_PER_S = 256  # ZMTP heartbeats and their answers, either mechanism
HANDSHAKE_BYTES = 4096  # greeting and handshake commands of a new connection
RECENT_CHECKS = 20  # "the last seconds": this many checks of every connection's bytes
SCAN_SHARE = 0.02  # of one core, at most, spent reading the connections' counters
POLL_S = 0.02  # how often the process's size is looked at
GROWTH_TRIGGER = 4 << 20  # growth since the last check that calls for one at once
PER_CONNECTION_BYTES = 128 << 10  # libzmq's own for one connection (~100 KiB measured): its buffers, queues

# struct tcp_info (linux/tcp.h): tcpi_state is its first byte; tcpi_bytes_received the u64 at
# this offset since Linux 4.1.
_BYTES_RECEIVED_OFFSET = 128
_TCP_CLOSE_WAIT = 8  # the other end sent its FIN: whatever is still queued is all that will come
_TCP_INFO = getattr(socket, "TCP_INFO", None)


@dataclass
class BufferEstimate:
    """Pure bookkeeping: from the connections' byte counters and what was read, the bytes held,
    and whom to shut down. `limit` in bytes."""

    limit: int
    held: int = 0
    read_bytes: int = 0
    read_frames: int = 0
    totals: dict[Connection, int] = field(default_factory=dict)
    recent: dict[Connection, deque[int]] = field(default_factory=dict)

    def update(
        self, received: Mapping[Connection, int], read_bytes: int, read_frames: int, seconds: float
    ) -> list[Connection]:
        """`received`: every live connection's byte counter; `read_bytes`, `read_frames`: what
        the node has read from the socket so far (cumulative). Returns the connections to shut
        down, most recent bytes first."""
        arrived, new = 0, 0
        for connection, total in received.items():
            before = self.totals.get(connection)
            if before is None:
                new += 1
                self.recent[connection] = deque(maxlen=RECENT_CHECKS)
                before = 0
            delta = max(0, total - before)
            self.totals[connection] = total
            self.recent[connection].append(delta)
            arrived += delta
        for gone in self.totals.keys() - received.keys():
            del self.totals[gone], self.recent[gone]
        read = read_bytes - self.read_bytes
        frames = read_frames - self.read_frames
        self.read_bytes, self.read_frames = read_bytes, read_frames
        allowance = frames * FRAME_OVERHEAD + new * HANDSHAKE_BYTES + int(len(received) * seconds * IDLE_BYTES_PER_S)
        self.held = max(0, self.held + arrived - read - allowance)
        # Whoever sent the most since the last check pushed the estimate over; a pump is still
        # pumping when it is caught. What each connection had read is unknown, so a busy honest
        # peer may rank above it: then it is shut down too (it reconnects), the pump next.
        shed: list[Connection] = []
        ranked = sorted(self.recent, key=lambda c: (self.recent[c][-1], sum(self.recent[c])), reverse=True)
        for connection in ranked:
            if self.held <= self.limit:
                break
            pumped = sum(self.recent[connection])
            if pumped == 0:
                break  # nothing arrived lately: nobody to blame (and nothing more is arriving)
            shed.append(connection)
            self.held = max(0, self.held - pumped)
            del self.totals[connection], self.recent[connection]
        return shed


def _open(connection: Connection) -> socket.socket | None:
    """A socket object over libzmq's descriptor (not a copy: detach() it, never close), if the
    descriptor still is that connection."""
    fd, peer = connection
    try:
        wrapped = socket.socket(fileno=fd)
    except OSError:
        return None  # closed, or no longer a socket
    try:
        if wrapped.getpeername() == peer:
            return wrapped
    except OSError:
        pass
    wrapped.detach()
    return None


def tcp_info(connection: Connection) -> tuple[int, bool] | None:
    """The kernel's count of bytes the connection received, and whether its sender has ended
    its stream; None if it is gone or not TCP."""
    if _TCP_INFO is None:
        return None
    wrapped = _open(connection)
    if wrapped is None:
        return None
    try:
        info = wrapped.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except OSError:
        return None
    finally:
        wrapped.detach()
    if len(info) < _BYTES_RECEIVED_OFFSET + 8:
        return None
    return struct.unpack_from("=Q", info, _BYTES_RECEIVED_OFFSET)[0], info[0] == _TCP_CLOSE_WAIT


def bytes_received(connection: Connection) -> int | None:
    """The kernel's count of bytes the connection received; None if it is gone or not TCP."""
    info = tcp_info(connection)
    return None if info is None else info[0]


def shut_down(connection: Connection) -> bool:
    """End the connection under libzmq: it sees the stream end, drops the connection and frees
    what it held for it. False if the connection was already gone."""
    wrapped = _open(connection)
    if wrapped is None:
        return False
    try:
        wrapped.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        wrapped.detach()


class GrowthAlarm:
    """Looks at the process's size every `poll_s` from a thread of its own and wakes whoever
    `watch`es when it grew by GROWTH_TRIGGER since they last `rearm`ed. A thread, because in the
    event loop each look cost a trio wake-up (~0.3 ms): 3 % of a core for an idle daemon, which
    100 daemons on 2 cores could not pay; a plain sleep and one pread of /proc/self/statm on a
    file kept open cost 0.3 %. Use as a context manager inside trio."""

    def __init__(self, poll_s: float = POLL_S, trigger: int = GROWTH_TRIGGER) -> None:
        """`poll_s`: `[transport].growth_check_ms`."""
        self.poll_s, self.trigger = poll_s, trigger
        self._token = trio.lowlevel.current_trio_token()
        self._watches: list[GrowthWatch] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="p2pnode-growth", daemon=True)

    def __enter__(self) -> GrowthAlarm:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping = True  # seen within poll_s
        self._thread.join()

    def watch(self) -> GrowthWatch:
        watch = GrowthWatch()
        self._watches.append(watch)
        return watch

    def _run(self) -> None:
        try:
            statm = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            return  # no /proc: only the periodic checks
        try:
            while not self._stopping:
                time.sleep(self.poll_s)
                self._look(int(os.pread(statm, 64, 0).split()[1]) * PAGE_BYTES)
        finally:
            os.close(statm)

    def _look(self, size: int) -> None:
        for watch in list(self._watches):
            if not watch.fired and size - watch.baseline > self.trigger:
                watch.fired = True
                try:
                    self._token.run_sync_soon(watch.event.set)
                except trio.RunFinishedError:
                    return


@dataclass
class GrowthWatch:
    """One watcher's view of a GrowthAlarm: `event` is set once the process grew past `baseline`."""

    baseline: int = field(default_factory=resident_bytes)
    event: trio.Event = field(default_factory=trio.Event)
    fired: bool = False

    def rearm(self) -> None:
        self.event, self.fired = trio.Event(), False  # a new event before the flag: the thread reads both
        self.baseline = resident_bytes()


def _scan(connections: list[Connection], ended_too: bool) -> tuple[dict[Connection, int], list[Connection]]:
    """Each connection's bytes received, and (if `ended_too`) those whose sender ended its stream."""
    received, ended = {}, []
    for connection in connections:
        info = tcp_info(connection)
        if info is not None:
            received[connection] = info[0]
            if ended_too and info[1]:
                ended.append(connection)
    return received, ended


class _HeapAfterConnections:
    """When to give the heap's free pages back after connections went. Connections that left by
    themselves (a sender of parts that never finish, gone) had their parts freed by libzmq, but
    freed pages stay in the heap: what the process grew by beyond those connections' own room
    (PER_CONNECTION_BYTES) is given back. Their room is kept for the next connections: DataLimit
    (process.py) counts on it (docs/security.md)."""

    def __init__(self) -> None:
        self.live: set[Connection] = set()
        self.left = 0  # connections gone since the last trim
        self.trimmed_at = resident_bytes()  # the process's size then

    def left_behind(self, received: Mapping[Connection, int]) -> bool:
        """Whether the connections gone since the last trim (`received`: those live now) left
        more free heap than their room."""
        self.left += len(self.live - received.keys())
        self.live = set(received)
        grown = resident_bytes() - self.trimmed_at
        return self.left > 0 and grown > GROWTH_TRIGGER + self.left * PER_CONNECTION_BYTES

    def give_back(self) -> None:
        trim_now()
        self.trimmed_at, self.left = resident_bytes(), 0


def _shut_ended_and_silent(
    ended: list[Connection],
    received: Mapping[Connection, int],
    shed: list[Connection],
    silence: SilentConnections | None,
    now: float,
    counts,
) -> bool:
    """Shut, beside those `shed`, the connections whose sender `ended` its stream and those
    `silence` says never spoke; whether any was shut."""
    shut = False
    for connection in ended:
        if connection not in shed and shut_down(connection):
            counts[ENDED] += 1
            shut = True
    for connection in silence.update(received, now) if silence is not None else []:
        if connection not in shed and shut_down(connection):
            counts[SILENT] += 1
            shut = True
    return shut


async def watch_buffers(
    connections: Callable[[], list[Connection]],
    read_so_far: Callable[[], tuple[int, int]],
    limit: int,
    interval_s: float,
    counts,
    socket: str = "inbound",
    alarm: GrowthAlarm | None = None,
    *,
    drop_ended: bool = False,
    silence: SilentConnections | None = None,
) -> None:
    """Every `interval_s`, and at once when `alarm` says the process grows fast, estimate what
    libzmq holds for the connections to one inbound socket (`socket` names it in the log) and
    shut down the pumps above `limit`; runs until cancelled. `read_so_far()`: (bytes, frames)
    read from that socket. With `drop_ended`, a connection whose sender ended its stream is shut
    down too: what it left queued would otherwise be read, at the socket's pace, long after the
    sender left (a flooder that queued megabytes and exited). With `silence`, a connection that
    sent nothing past its handshake in time is shut (silence.py). Pages libzmq freed are given back
    to the system when connections went and the process grew by more than their own room."""
    if _TCP_INFO is None:
        log.warning("no TCP_INFO on this platform: the bytes ZeroMQ holds are not bounded")
        return
    estimate = BufferEstimate(limit)
    last = trio.current_time()
    scan_s = 0.0
    growth = alarm.watch() if alarm is not None else None
    heap = _HeapAfterConnections()
    while True:
        # A pump on loopback moves hundreds of MB a second: between two checks it would get
        # far past the limit. So the process's size is looked at often (GrowthAlarm) and a
        # check runs as soon as it grew by GROWTH_TRIGGER. A check costs ~25 µs a connection:
        # with many, checks are spaced out so that they never take more than SCAN_SHARE of a
        # core (a pump then gets further before it is caught).
        with trio.move_on_at(last + interval_s):
            await (growth.event.wait() if growth is not None else trio.sleep_forever())
        await trio.sleep_until(last + max(POLL_S, scan_s / SCAN_SHARE))
        now = trio.current_time()
        started = time.perf_counter()
        received, ended = _scan(connections(), drop_ended)
        scan_s = time.perf_counter() - started
        shed = [c for c in estimate.update(received, *read_so_far(), now - last) if shut_down(c)]
        others = _shut_ended_and_silent(ended, received, shed, silence, now, counts)
        for connection in shed:
            counts[SHED] += 1
            log.warning(
                "shut down the connection from %s to the %s socket: ZeroMQ held over %d MB for "
                "that socket's connections, most of it arriving on this one",
                connection[1][0],
                socket,
                limit >> 20,
            )
        if heap.left_behind(received) or shed or others:  # first: it follows who is live at every check
            await trio.sleep(POLL_S)  # libzmq drops the connections and frees their parts
            heap.give_back()  # those bytes were never read: the node's own trimming would not see them
        if growth is not None:
            growth.rearm()
        last = now
