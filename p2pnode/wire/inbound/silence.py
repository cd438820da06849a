"""Connections that never speak: a stranger's handshake held open costs the public socket a slot
of its connection caps (zap.py) and libzmq ~40 KiB, for as long as the stranger likes. An honest
node sends its HELLO on the public socket as soon as it connects (discovery/peers.py); a
connection that has received no more than a handshake's bytes `silent_s` after it was first seen
is shut (buffers.py `shut_down`: libzmq drops it and frees what it held) and counted
(`shut_silent`).

The kernel's byte count (TCP_INFO, buffers.py `tcp_info`) tells: a completed handshake is
HANDSHAKE_BYTES of its mechanism at most, and the smallest frame an honest node sends (signed:
a 64-byte signature and a 32-byte key, in a ZMTP frame, over CURVE in a MESSAGE box) takes a
connection past it. What the bound does not catch: a stranger that sends a frame, any frame, has
spoken, and is held to the caps alone (docs/security.md). An honest connection that comes back
silent (libzmq reconnects after a drop) may be shut too, and comes back again: a handshake per
`silent_s` until its node next sends on it.
"""

from __future__ import annotations

from collections.abc import Mapping

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["HANDSHAKE_BYTES", "SILENT", "SilentConnections"]

SILENT = "shut_silent"  # Metrics.connections

# A completed ZMTP 3 handshake as libzmq 4.3's DEALER makes it, measured (tests/test_silence.py
# checks both against libzmq itself): greeting and READY, 107 bytes; greeting, HELLO, INITIATE
# with its metadata box, 567 bytes. A little above each, never the size of a signed frame above.
HANDSHAKE_BYTES = {"NULL": 128, "CURVE": 608}


class SilentConnections:
    """Pure bookkeeping: which connections have been seen for `silent_s` and received no more
    than `handshake_bytes`. Connections are any hashable name (buffers.py `Connection`)."""

    def __init__(self, silent_s: float, handshake_bytes: int) -> None:
        self.silent_s, self.handshake_bytes = silent_s, handshake_bytes
        self.watching: dict[object, float] = {}  # connection -> when first seen, not heard from yet
        self.spoken: set[object] = set()  # connections heard from: never shut here

    def update(self, received: Mapping[object, int], now: float) -> list[object]:
        """`received`: every live connection's byte count at `now`. Returns those to shut."""
        for gone in self.watching.keys() - received.keys():
            del self.watching[gone]
        self.spoken.intersection_update(received.keys())
        silent = []
        for connection, total in received.items():
            if connection in self.spoken:
                continue
            if total > self.handshake_bytes:
                self.spoken.add(connection)
                self.watching.pop(connection, None)
                continue
            if now - self.watching.setdefault(connection, now) >= self.silent_s:
                silent.append(connection)
                del self.watching[connection]
        return silent
