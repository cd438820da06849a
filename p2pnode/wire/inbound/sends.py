"""Frames an ingress process sends over the connections its ROUTER holds (issue #46): replies to a
node that dialled this one from behind a NAT, which nobody can dial back, and, in a node that
cannot be dialled itself (client mode), everything it sends over the connections it dialled.

Sends never wait, as on the node's DEALERs (transport.py): a frame for a connection that is gone
(ROUTER_MANDATORY) or whose queue is full (SNDHWM) is dropped and counted. What libzmq holds for
sending is also bounded in bytes (`max_bytes`): each frame is handed over with a tracker that
says when libzmq has let go of it (written to TCP, or the connection gone), and a frame that
would take the bytes held past the bound is dropped and counted too, as is one that would take
its connection's share past `max_connection_bytes`: a neighbour that stops reading holds that
much at most, not the whole bound. The process's hard memory limit has room for the bound
(process.py `DataLimit`).
"""

from __future__ import annotations

from collections import Counter

import zmq
from zmq.utils.garbage import gc as zero_copy_collector

__all__ = ["RoutedSends", "SEND_GONE", "SEND_FULL", "SEND_OVER_BYTES", "SEND_OVER_CONNECTION_BYTES", "OUTBOUND_SLACK"]

OUTBOUND_SLACK = 1024  # on the node's pipe to the process: msgpack and the routing id around a frame, or a dial

# Counted (in the node's connection counts) for each frame not sent, by why.
SEND_GONE = "routed_send_gone"  # no connection with that routing id (any more)
SEND_FULL = "routed_send_full"  # its queue (SNDHWM) is full
SEND_OVER_BYTES = "routed_send_over_bytes"  # libzmq holds `max_bytes` for sending already
SEND_OVER_CONNECTION_BYTES = "routed_send_over_connection_bytes"  # ... or `max_connection_bytes` for this connection


class RoutedSends:
    """`send(routing_id, frame)` on `router`, within `max_bytes` held in all and
    `max_connection_bytes` for one connection; `held` and `held_by` say how many."""

    def __init__(self, router: zmq.Socket, max_bytes: int, counts: Counter[str], max_connection_bytes: int) -> None:
        self.router, self.max_bytes, self.counts = router, max_bytes, counts
        self.max_connection_bytes = min(max_connection_bytes, max_bytes)
        router.copy_threshold = 0  # pyzmq copies smaller frames and lets go of them at once: untracked
        # pyzmq hands zero-copy frames back through a thread (and context) of its own, started at
        # the first: start it now, before the process's memory limit leaves no room for a thread
        # (process.py DataLimit; libzmq aborts when it cannot start one).
        if not zero_copy_collector.is_alive():
            zero_copy_collector.start()
        self.held_by: Counter[bytes] = Counter()  # routing id -> bytes libzmq holds for it
        self._tracked: list[tuple[zmq.MessageTracker, int, bytes]] = []

    @property
    def held(self) -> int:
        return sum(self.held_by.values())

    def send(self, routing_id: bytes, frame: bytes) -> bool:
        """Whether libzmq took `frame` for the connection `routing_id`."""
        self._release()
        if self.held + len(frame) > self.max_bytes:
            self.counts[SEND_OVER_BYTES] += 1
            return False
        if self.held_by[routing_id] + len(frame) > self.max_connection_bytes:
            self.counts[SEND_OVER_CONNECTION_BYTES] += 1
            return False
        try:
            self.router.send(routing_id, zmq.NOBLOCK | zmq.SNDMORE)
            tracker = self.router.send(frame, zmq.NOBLOCK, copy=False, track=True)
        except zmq.Again:
            self.counts[SEND_FULL] += 1
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.counts[SEND_GONE] += 1
            return False
        self._tracked.append((tracker, len(frame), routing_id))
        self.held_by[routing_id] += len(frame)
        self.counts["routed_sent"] += 1
        return True

    def _release(self) -> None:
        """Forget the frames libzmq has let go of."""
        if self._tracked:
            self._tracked = [entry for entry in self._tracked if not entry[0].done]
            self.held_by = Counter()
            for _, size, routing_id in self._tracked:
                self.held_by[routing_id] += size
