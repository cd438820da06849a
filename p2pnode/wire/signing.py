"""Where a frame is signed: on the event loop, or in a worker thread for large payloads.

Measured with `p2pnode bench transport` (BENCHMARKS.md): handing a 20 KB frame to a thread
halves the rate (the hand-off costs more than the 52 µs signature), while a 200 KB frame gains
~10 % (its 350 µs signature no longer stalls the loop). The threshold is
[transport].sign_in_thread_bytes.
"""

from __future__ import annotations

import trio

from protocol import Body, Encoder

__all__ = ["encode"]


async def encode(encoder: Encoder, body: Body, *, seq: int, timestamp_us: int, round: int, threshold: int) -> bytes:
    if body.payload_bytes() < threshold:
        return encoder.encode(body, seq=seq, timestamp_us=timestamp_us, round=round)
    return await trio.to_thread.run_sync(lambda: encoder.encode(body, seq=seq, timestamp_us=timestamp_us, round=round))
