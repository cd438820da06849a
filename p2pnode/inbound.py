"""The receive path: read frames, refuse floods, check signatures off the event loop, then
the replay guard, and hand each accepted envelope to the node.

    transport.receive ─► rate limit per connection ─► batches ─► verify threads (Decoder)
        ─► replay guard (event loop) ─► handler

Every stage is bounded: the batch (in frames and in bytes), the queue of batches (when full,
reading stops and ZeroMQ pushes back on the senders), the number of verify threads. At most
(verify_queue + verify_threads) batches are alive, each within verify_batch_bytes or one frame.
Every refusal is counted by reason; none stops the loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

import trio

from protocol import Decoder, Envelope, ProtocolError, ReplayGuard

from .config import TransportSettings
from .metrics import MULTIPART, RATE_LIMITED, Metrics
from .transport import Transport

__all__ = ["Inbound", "TokenBuckets"]

# Takes an accepted envelope and its frame; returns None, or the reason it refuses it after all.
Handler = Callable[[Envelope, bytes], Awaitable[str | None]]


class TokenBuckets:
    """A token bucket per key (a ZeroMQ connection), least recently used dropped past `capacity`."""

    def __init__(self, rate: float, burst: int, capacity: int = 4096) -> None:
        self.rate, self.burst, self.capacity = rate, burst, capacity
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # key -> (tokens, time)

    def allow(self, key: bytes, now: float) -> bool:
        tokens, then = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= 1
        self._buckets[key] = (tokens - 1 if allowed else tokens, now)
        if len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)
        return allowed


def decode_all(decoder: Decoder, frames: list[bytes]) -> list[Envelope | ProtocolError]:
    """Runs in a worker thread: Decoder.decode is pure, and Ed25519 verification releases the GIL."""
    results: list[Envelope | ProtocolError] = []
    for frame in frames:
        try:
            results.append(decoder.decode(frame))
        except ProtocolError as exc:
            results.append(exc)
    return results


class Inbound:
    def __init__(
        self,
        transport: Transport,
        decoder: Decoder,
        guard: ReplayGuard,
        metrics: Metrics,
        settings: TransportSettings,
        clock_us: Callable[[], int],
    ) -> None:
        self.transport, self.decoder, self.guard = transport, decoder, guard
        self.metrics, self.settings, self.clock_us = metrics, settings, clock_us
        self.buckets = TokenBuckets(settings.rate_per_connection, settings.burst_per_connection)
        self.verify_limiter = trio.CapacityLimiter(settings.verify_threads)

    async def run(self, handle: Handler) -> None:
        """Receive until cancelled, calling `handle(envelope, frame)` for every frame that passes."""
        send, receive = trio.open_memory_channel[list[bytes]](self.settings.verify_queue)
        async with trio.open_nursery() as nursery, send, receive:
            nursery.start_soon(self._read, send.clone())
            for _ in range(self.settings.verify_threads):
                nursery.start_soon(self._verify, receive.clone(), handle)

    async def _read(self, batches: trio.MemorySendChannel[list[bytes]]) -> None:
        async with batches:
            while True:
                messages = await self.transport.receive(self.settings.verify_batch, self.settings.verify_batch_bytes)
                now = trio.current_time()
                frames = []
                for parts in messages:
                    if len(parts) != 2:  # [routing id, frame]; a DEALER sending more parts is not a peer
                        self.metrics.rejected(MULTIPART, sum(map(len, parts[1:])))
                    elif not self.buckets.allow(parts[0], now):
                        self.metrics.rejected(RATE_LIMITED, len(parts[1]))
                    else:
                        frames.append(parts[1])
                if frames:
                    await batches.send(frames)

    async def _verify(self, batches: trio.MemoryReceiveChannel[list[bytes]], handle: Handler) -> None:
        async with batches:
            async for frames in batches:
                results = await trio.to_thread.run_sync(decode_all, self.decoder, frames, limiter=self.verify_limiter)
                now_us = self.clock_us()
                for frame, result in zip(frames, results, strict=True):
                    if isinstance(result, ProtocolError):
                        self.metrics.rejected(result.reason.value, len(frame))
                        continue
                    try:
                        self.guard.admit(result.sender, result.seq, result.timestamp_us, now_us)
                    except ProtocolError as exc:
                        self.metrics.rejected(exc.reason.value, len(frame))
                        continue
                    refusal = await handle(result, frame)
                    if refusal is None:
                        self.metrics.received(result.type, result.size)
                    else:
                        self.metrics.rejected(refusal, result.size)
