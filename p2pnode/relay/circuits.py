"""A relay's circuits: which frames it forwards, between whom, how fast.

A RELAY from an admitted peer (the origin) to a target is forwarded where the target holds a
place here (book.py), or where the target itself opened a circuit to the origin (the answer to
it): a circuit is one (origin, target) pair. Each is bounded in bytes a second (`circuit_rate`,
its burst the largest frame), the relay in all (`total_rate`), in number (`max_circuits`,
`max_circuits_per_peer` opened by one origin: one at that bound makes room by closing its oldest
circuit never answered) and in frame size (`max_frame_bytes`); one that forwarded nothing for
`circuit_idle_s` closes. So a peer with many keys gets a bounded share of
a bounded pipe, only to nodes that asked the relay for a place, and never a free one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .book import Reservations
from .settings import RelaySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["Circuit", "CircuitBook"]

# Why a RELAY is not forwarded (UNRELAYED.reason; protocol/messages.py UNRELAYED_REASONS).
NO_RESERVATION, CIRCUITS_FULL, RATE, TOO_LARGE, GONE = "no_reservation", "circuits_full", "rate", "too_large", "gone"


@dataclass
class Circuit:
    opened_at: float
    last_at: float
    tokens: float  # bytes it may forward at `refilled_at`
    refilled_at: float
    forwarded: int = 0  # bytes
    frames: int = 0


class CircuitBook:
    def __init__(self, settings: RelaySettings, reservations: Reservations, counts: Counter[str]) -> None:
        self.settings, self.reservations, self.counts = settings, reservations, counts
        self.circuits: dict[tuple[bytes, bytes], Circuit] = {}
        self._opened_by: Counter[bytes] = Counter()
        self._total = (max(float(settings.max_frame_bytes), settings.total_rate), None)  # relay-wide: (tokens, when)

    def forward(self, origin: bytes, target: bytes, size: int, peers, now: float) -> str | None:
        """A RELAY of `size` sealed bytes from peer `origin` to `target`: None if it is forwarded
        (and counted), else why not. `peers`: the relay's admitted peers."""
        settings = self.settings
        refusal = None
        if target not in peers:
            refusal = GONE
        elif size > settings.max_frame_bytes:
            refusal = TOO_LARGE
        circuit = None if refusal else self._circuit(origin, target, now)
        if refusal is None and circuit is None:
            answer = (target, origin) in self.circuits
            refusal = CIRCUITS_FULL if answer or self.reservations.holds(target, now) else NO_RESERVATION
        if refusal is None and not self._spend(circuit, size, now):
            refusal = RATE
        if refusal is not None:
            self.counts[f"unrelayed_{refusal}"] += 1
            return refusal
        circuit.last_at, circuit.forwarded, circuit.frames = now, circuit.forwarded + size, circuit.frames + 1
        self.counts["relayed_frames"] += 1
        self.counts["relayed_bytes"] += size
        return None

    def _circuit(self, origin: bytes, target: bytes, now: float) -> Circuit | None:
        """The open circuit from `origin` to `target`, opened now if the target holds a place or
        opened one the other way, within the caps; None if it may not be."""
        circuit = self.circuits.get((origin, target))
        if circuit is not None:
            return circuit
        if not (self.reservations.holds(target, now) or (target, origin) in self.circuits):
            return None
        settings = self.settings
        if self._opened_by[origin] >= settings.max_circuits_per_peer:
            self._close_unanswered(origin)
        if len(self.circuits) >= settings.max_circuits or self._opened_by[origin] >= settings.max_circuits_per_peer:
            return None
        burst = max(float(settings.max_frame_bytes), settings.circuit_rate)
        circuit = self.circuits[(origin, target)] = Circuit(now, now, burst, now)
        self._opened_by[origin] += 1
        self.counts["circuits_opened"] += 1
        return circuit

    def _close_unanswered(self, origin: bytes) -> None:
        """Make room among `origin`'s circuits: close its oldest one that its target never answered
        (no circuit back). A node that holds a place and never answers (a stranger's key) would
        otherwise keep every origin's circuits to it open until idle, and with a few such places
        its peers could open none to the clients that do answer; an answered circuit stays."""
        unanswered = [
            (circuit.opened_at, pair)
            for pair, circuit in self.circuits.items()
            if pair[0] == origin and (pair[1], origin) not in self.circuits
        ]
        if unanswered:
            self._close(min(unanswered)[1])
            self.counts["circuits_unanswered_closed"] += 1

    def _spend(self, circuit: Circuit, size: int, now: float) -> bool:
        """Each bucket holds a second of its rate, and at least the largest frame: a round's
        payloads leave every node at once, and a burst within a second's rate is no abuse."""
        settings = self.settings
        burst = max(float(settings.max_frame_bytes), settings.circuit_rate)
        circuit.tokens = min(burst, circuit.tokens + (now - circuit.refilled_at) * settings.circuit_rate)
        circuit.refilled_at = now
        total, then = self._total
        total_burst = max(float(settings.max_frame_bytes), settings.total_rate)
        total = min(total_burst, total + (now - (then if then is not None else now)) * settings.total_rate)
        if circuit.tokens < size or total < size:
            self._total = (total, now)
            return False
        circuit.tokens -= size
        self._total = (total - size, now)
        return True

    def close_idle(self, now: float, peers) -> None:
        """Close circuits idle past `circuit_idle_s`, and those of nodes no longer peers."""
        idle = self.settings.circuit_idle_s
        for pair, circuit in list(self.circuits.items()):
            if now - circuit.last_at > idle or not (pair[0] in peers and pair[1] in peers):
                self._close(pair)

    def _close(self, pair: tuple[bytes, bytes]) -> None:
        del self.circuits[pair]
        self._opened_by[pair[0]] -= 1
        if self._opened_by[pair[0]] <= 0:
            del self._opened_by[pair[0]]
        self.counts["circuits_closed"] += 1
