"""The receive path: read frames, judge each by its header and connection, check signatures off
the event loop, then the replay guard, and hand each accepted envelope to the node, in order.

    ingress.receive ─► header check + gate (gate.py) ─► batches ─► verify threads (Decoder)
        ─► in receive order: replay guard ─► handler

Every stage is bounded: the public socket's reading pace (strangers' frames: `stranger_rate`,
gate.py), the batch (in frames and in bytes), the batches in flight (when
`verify_queue` of them wait, reading stops and ZeroMQ pushes back on the senders), the number of
verify threads. Batches are handled in the order they were read, whichever thread finishes
first, so a peer's frames reach the node in the order it sent them (its handshake before what
follows it). Every refusal is counted by reason; none stops the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from protocol import (
    Decoder,
    Envelope,
    MessageType,
    ProtocolError,
    Reason,
    Relayed,
    ReplayGuard,
    Sealing,
    node_id,
    opened_header,
)
from protocol.curve import curve_public_from_ed25519

from ...metrics import HANDSHAKE_FIRST, MULTIPART, UNKNOWN_PEER, Metrics
from ..gate import CHALLENGE_TYPES, PARK, Gate
from ..settings import TransportSettings
from ..zmqsetup import CLIENT, PEERS, PUBLIC
from .supervisor import Ingress

__all__ = ["Inbound", "decode_all", "RELAYED"]

log = logging.getLogger("p2pnode.inbound")

COALESCE_BELOW = 16  # messages in a read
COALESCE_S = 0.005
REPLAY_LOG_EVERY_S = 60.0  # per sender: a replay is worth a line, a flood of them is not

# Takes an accepted envelope, its frame and the host a stranger's connection comes from (if
# known); returns None, or the reason it refuses it after all.
Handler = Callable[[Envelope, bytes, str | None], Awaitable[str | None]]
# Told, before the handler, each accepted envelope and the socket and routing id of the
# connection it came on (routes.py learns where client peers are from it).
RouteSeen = Callable[[Envelope, str, bytes], None]
# Frames that came through a relay, sealed (relay/link.py): each circuit, (relay, origin), is a
# connection of its own for the gate, its routing id the two keys.
RELAYED = "relayed"
# Each socket's connections apart: a prefix of the connection's id in the gate.
_PREFIXES = {PUBLIC: b"p", PEERS: b"P", CLIENT: b"c", RELAYED: b"v"}
_SOCKETS = {prefix[0]: name for name, prefix in _PREFIXES.items()}


def decode_all(decoder: Decoder, frames: list[bytes]) -> list[Envelope | ProtocolError]:
    """Runs in a worker thread: Decoder.decode is pure, and Ed25519 verification releases the GIL."""
    results: list[Envelope | ProtocolError] = []
    for frame in frames:
        try:
            results.append(decoder.decode(frame))
        except ProtocolError as exc:
            results.append(exc)
    return results


@dataclass
class _Batch:
    connections: list[bytes] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)
    results: list[Envelope | ProtocolError] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


class Inbound:
    def __init__(
        self,
        ingress: Mapping[str, Ingress],
        decoder: Decoder,
        guard: ReplayGuard,
        gate: Gate,
        metrics: Metrics,
        settings: TransportSettings,
        clock_us: Callable[[], int],
    ) -> None:
        self.ingress, self.decoder, self.guard, self.gate = ingress, decoder, guard, gate
        self.metrics, self.settings, self.clock_us = metrics, settings, clock_us
        self._replays_logged: dict[bytes, float] = {}  # sender -> when its last replay was logged
        self.verify_limiter = trio.CapacityLimiter(settings.verify_threads)
        self._pending = 0  # frames read and passed to verification, not yet handled
        self.route_seen: RouteSeen | None = None
        self.sealing: Sealing | None = None  # opens frames that came through a relay (`deliver_relayed`)

    @property
    def in_flight(self) -> int:
        """Frames read and neither counted as received nor refused yet: being verified, waiting
        for delivery, being handled, or parked by the gate. Every frame the ingress read (its `messages_read`)
        is counted once it leaves here."""
        return self._pending + self.gate.parked_frames

    async def verify_relayed(
        self, hellos: tuple[bytes, ...], known: set[bytes], counted_as: str = "relayed"
    ) -> list[tuple[Envelope, bytes]]:
        """Check the HELLO frames a PEERS relays (or a LAN beacon: `counted_as`) in a worker
        thread, skipping the `known` ones (the same bytes were checked when they came); refused
        ones are counted as `relayed_*` (`beacon_*`)."""
        fresh = [frame for frame in dict.fromkeys(hellos) if frame not in known]
        if not fresh:
            return []
        results = await trio.to_thread.run_sync(decode_all, self.decoder, fresh, limiter=self.verify_limiter)
        relayed = []
        for frame, result in zip(fresh, results, strict=True):
            if isinstance(result, ProtocolError):
                self.metrics.rejected(f"{counted_as}_{result.reason.value}", len(frame))
            elif result.type is not MessageType.HELLO:
                self.metrics.rejected(f"{counted_as}_not_hello", len(frame))
            else:
                relayed.append((result, frame))
        return relayed

    async def deliver_relayed(self, relay: bytes, relayed: Relayed, handle: Handler) -> None:
        """A frame that admitted peer `relay` forwarded from `origin` (RELAYED): opened, then judged
        as one that came on a connection of its own, the circuit (relay, origin): the strangers'
        budget (the relay standing for their subnet), the gate (handshake frames only until the
        origin is a peer; with CURVE, the seal stands for the transport's proof of the key),
        the signature, the origin's replay window, then `handle`. Every refusal is counted."""
        now, origin, sealed = trio.current_time(), relayed.origin, relayed.sealed
        connection = _PREFIXES[RELAYED] + relay + origin
        circuit = {"Peer-Address": f"relay:{relay.hex()[:16]}"}
        try:
            seq, frame = self.sealing.open(origin, sealed)
            circuit["User-Id"] = curve_public_from_ed25519(origin).hex()  # it opened: a key that has one
            refusal = self.gate.budget(connection, circuit.get, now)
            if refusal is None:
                header = opened_header(self.decoder, origin, seq, frame)
                refusal = self.gate.admit(connection, header, circuit.get, now)
                if refusal == PARK and self.gate.park(connection, frame, header.seq, now):
                    return
        except ProtocolError as exc:
            self.metrics.rejected(exc.reason.value, len(sealed))
            return
        if refusal is not None:
            self.metrics.rejected(HANDSHAKE_FIRST if refusal == PARK else refusal, len(frame))
            return
        (result,) = await trio.to_thread.run_sync(decode_all, self.decoder, [frame], limiter=self.verify_limiter)
        self._pending += 1
        await self._deliver_counted(connection, frame, result, handle)

    async def run(self, handle: Handler) -> None:
        """Receive until cancelled, calling `handle(envelope, frame, source)` for every frame that passes."""
        queue = self.settings.verify_queue
        to_verify, verify = trio.open_memory_channel[_Batch](queue)
        to_deliver, deliver = trio.open_memory_channel[_Batch](queue + self.settings.verify_threads)
        async with trio.open_nursery() as nursery, to_verify, verify, to_deliver, deliver:
            for name in self.ingress:  # PUBLIC and PEERS, or a client node's CLIENT
                nursery.start_soon(self._read, to_verify.clone(), to_deliver.clone(), name)
            for _ in range(self.settings.verify_threads):
                nursery.start_soon(self._verify, verify.clone())
            nursery.start_soon(self._deliver, deliver.clone(), handle)

    async def _read(
        self, to_verify: trio.MemorySendChannel[_Batch], to_deliver: trio.MemorySendChannel[_Batch], name: str
    ) -> None:
        """Read the socket `name`: each reader's batches are delivered in the order it read them.
        A client's connections, which it dialled, are read as the public socket is: strangers'
        frames at their pace, peers' links freely."""
        peers = name == PEERS
        async with to_verify, to_deliver:
            while True:
                if not peers:  # strangers' frames: no faster than their budget (gate.py)
                    await trio.sleep(self.gate.stranger_reads.wait_s(trio.current_time()))
                messages = await self.ingress[name].receive(
                    self.settings.verify_batch, self.settings.verify_batch_bytes
                )
                batch = self._admit(messages, trio.current_time(), _PREFIXES[name])
                if batch.frames:
                    self._pending += len(batch.frames)
                    await to_deliver.send(batch)  # first: delivery order is read order
                    await to_verify.send(batch)
                if len(batch.frames) < len(messages) and self._drained(messages):
                    # Frames were refused here, and the queue is empty: maybe a flood of small
                    # frames. Each wake-up costs more than the few frames it brings, so let the
                    # next ones gather for a moment.
                    await trio.sleep(COALESCE_S)

    def _drained(self, messages: list[list]) -> bool:
        """Whether a read took few messages, and not because the batch was full of bytes."""
        if len(messages) >= COALESCE_BELOW:
            return False
        return sum(len(parts[-1]) for parts in messages) < self.settings.verify_batch_bytes // 2

    def _admit(self, messages: list[list], now: float, prefix: bytes) -> _Batch:
        """The frames of `messages` that may be verified; the rest are counted and dropped.
        On the peers' socket admitted peers' frames pass without spending the strangers' budget
        (with CURVE, only admitted peers and keys being verified can connect there at all);
        others' PINGs and PONGs are judged as on the public socket, the rest parked or refused."""
        batch, peers = _Batch(), prefix == _PREFIXES[PEERS]
        for parts in messages:
            # Routing ids are per socket: the prefix keeps the sockets' connections apart.
            connection, message = prefix + parts[0], parts[1]
            refusal = None if peers else self.gate.budget(connection, message.get, now)
            if refusal is None and len(parts) != 2:  # [routing id, frame]; more parts: not a peer
                refusal = MULTIPART
            if refusal is not None:
                self.metrics.rejected(refusal, sum(map(len, parts[1:])))
                continue
            try:  # on ZeroMQ's buffer: a frame refused here is never copied
                header = self.decoder.peek(message.buffer)
            except ProtocolError as exc:
                self.metrics.rejected(exc.reason.value, len(message))
                continue
            if peers and not self.gate.is_peer(header.sender):
                if header.type not in CHALLENGE_TYPES:
                    if not self.gate.hold_for_admission(connection, header, message.get, message.bytes, now):
                        self.metrics.rejected(UNKNOWN_PEER, len(message))
                    continue
                # A key being verified, or a peer this node dropped that has not noticed: it sends
                # on this socket, and its PONG may be the answer that (re-)admits it. Judged as on
                # the public socket, within the strangers' budget.
                self.gate.vouch(connection, header, message.get)
                refusal = self.gate.budget(connection, message.get, now)
                if refusal is not None:
                    self.metrics.rejected(refusal, len(message))
                    continue
            refusal = self.gate.admit(connection, header, message.get, now)
            if refusal == PARK and self.gate.park(connection, message.bytes, header.seq, now):
                continue
            if refusal is not None:
                reason = HANDSHAKE_FIRST if refusal == PARK else refusal
                self.metrics.rejected(reason, len(message))
                if log.isEnabledFor(logging.DEBUG):  # a flood passes here: no node id hashed for nothing
                    log.debug("refused %s from %s before verification: %s", header.type, node_id(header.sender), reason)
                continue
            batch.connections.append(connection)
            batch.frames.append(message.bytes)
        return batch

    async def _verify(self, batches: trio.MemoryReceiveChannel[_Batch]) -> None:
        async with batches:
            async for batch in batches:
                batch.results = await trio.to_thread.run_sync(
                    decode_all, self.decoder, batch.frames, limiter=self.verify_limiter
                )
                batch.done.set()

    async def _deliver(self, batches: trio.MemoryReceiveChannel[_Batch], handle: Handler) -> None:
        async with batches:
            async for batch in batches:
                await batch.done.wait()
                for connection, frame, result in zip(batch.connections, batch.frames, batch.results, strict=True):
                    await self._deliver_counted(connection, frame, result, handle)
                if self.gate.parked_bytes:
                    await self._deliver_parked(handle)

    async def _deliver_parked(self, handle: Handler) -> None:
        """Frames held by the gate whose key the frames just handled admitted (gate.py)."""
        released, expired = self.gate.unpark(trio.current_time())
        self._pending += sum(len(frames) for _, frames in released)
        for frame in expired:
            self.metrics.rejected(HANDSHAKE_FIRST, len(frame))
            log.debug("a parked frame of %d bytes expired: its sender was not admitted in time", len(frame))
        for connection, frames in released:
            results = await trio.to_thread.run_sync(decode_all, self.decoder, frames, limiter=self.verify_limiter)
            for frame, result in zip(frames, results, strict=True):
                await self._deliver_counted(connection, frame, result, handle)

    async def _deliver_counted(
        self, connection: bytes, frame: bytes, result: Envelope | ProtocolError, handle: Handler
    ) -> None:
        """`_deliver_one`, the frame still in `in_flight` until it is counted: the handler waits,
        and a frame being handled was once neither in flight nor counted (a flood test saw it)."""
        try:
            await self._deliver_one(connection, frame, result, handle)
        finally:
            self._pending -= 1

    async def _deliver_one(
        self, connection: bytes, frame: bytes, result: Envelope | ProtocolError, handle: Handler
    ) -> None:
        if not isinstance(result, ProtocolError):
            try:
                self.guard.admit(result.sender, result.seq, result.timestamp_us, self.clock_us())
            except ProtocolError as exc:
                if exc.reason is Reason.REPLAY:
                    self._log_replay(result, exc)
                result = exc
        if isinstance(result, ProtocolError):
            self.gate.failed(connection)
            self.metrics.rejected(result.reason.value, len(frame))
            return
        self.gate.verified(connection, result.sender)
        if self.route_seen is not None:
            self.route_seen(result, _SOCKETS[connection[0]], connection[1:])
        refusal = await handle(result, frame, self.gate.source(connection))
        if refusal is None:
            self.metrics.received(result.type, result.size)
        else:
            self.metrics.rejected(refusal, result.size)

    def _log_replay(self, envelope: Envelope, refusal: ProtocolError) -> None:
        """A signed frame of a trusted sender refused as a replay: a captured frame sent again, or
        an honest one that arrived after its sender's (re-)admission counted its number as seen."""
        now = trio.current_time()
        if now - self._replays_logged.get(envelope.sender, -REPLAY_LOG_EVERY_S) < REPLAY_LOG_EVERY_S:
            return
        self._replays_logged[envelope.sender] = now
        while len(self._replays_logged) > self.guard.max_senders:
            del self._replays_logged[next(iter(self._replays_logged))]
        log.info("refused a %s of peer %s as a replay: %s", envelope.type, node_id(envelope.sender), refusal)
