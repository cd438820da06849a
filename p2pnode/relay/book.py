"""A relay's reservations: which client nodes it holds a place for, and until when.

A place goes only to an admitted peer (RESERVE is taken from peers alone), so a stranger with
many keys first needs each admitted, within `[discovery].max_peers_per_subnet`; then its subnet
gets `max_reservations_per_subnet` places and the relay `max_reservations` in all. A live place
is never taken back for a newcomer (as a settled peer is never displaced): whoever holds one
keeps it until it expires, is given up, or its holder stops being a peer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .settings import RelaySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["FULL", "SUBNET", "NOT_RELAY", "Reservation", "Reservations"]

# Why a RESERVE is refused (RESERVED.refused; protocol/messages.py RELAY_REFUSALS).
FULL, SUBNET, NOT_RELAY = "full", "subnet", "not_relay"


@dataclass
class Reservation:
    subnet: str | None  # None: in a network exempt from the subnet limits
    granted_at: float
    expires_at: float


class Reservations:
    """The places held, by holder key; counts go to `counts` (`status`'s `relay`)."""

    def __init__(self, settings: RelaySettings, counts: Counter[str]) -> None:
        self.settings = settings
        self.counts = counts
        self.held: dict[bytes, Reservation] = {}
        self._per_subnet: Counter[str] = Counter()

    def request(self, key: bytes, subnet: str | None, ttl_s: int, now: float) -> tuple[int, str | None]:
        """RESERVE from peer `key` of `subnet`: the seconds granted (at most those asked) and None,
        or 0 and why not. `ttl_s` 0 gives a held place up."""
        if not self.settings.enabled:
            self.counts["reservation_refused_not_relay"] += 1
            return 0, NOT_RELAY
        if ttl_s == 0:
            self.drop(key)
            return 0, None
        granted = int(min(ttl_s, self.settings.reservation_ttl_s))
        held = self.held.get(key)
        if held is not None:
            held.expires_at = now + granted
            self.counts["reservations_renewed"] += 1
            return granted, None
        if subnet is not None and self._per_subnet[subnet] >= self.settings.max_reservations_per_subnet:
            self.counts["reservation_refused_subnet"] += 1
            return 0, SUBNET
        if len(self.held) >= self.settings.max_reservations:
            self.counts["reservation_refused_full"] += 1
            return 0, FULL
        self.held[key] = Reservation(subnet, now, now + granted)
        if subnet is not None:
            self._per_subnet[subnet] += 1
        self.counts["reservations_granted"] += 1
        return granted, None

    def holds(self, key: bytes, now: float) -> bool:
        held = self.held.get(key)
        return held is not None and held.expires_at > now

    def expire(self, now: float, peers) -> list[bytes]:
        """Drop the places expired, and those of holders no longer among `peers`; returns their keys."""
        gone = [key for key, held in self.held.items() if held.expires_at <= now or key not in peers]
        for key in gone:
            self.counts["reservations_expired" if key in peers else "reservations_holder_gone"] += 1
            self.drop(key)
        return gone

    def drop(self, key: bytes) -> None:
        held = self.held.pop(key, None)
        if held is not None and held.subnet is not None:
            self._per_subnet[held.subnet] -= 1
            if self._per_subnet[held.subnet] <= 0:
                del self._per_subnet[held.subnet]

    def __len__(self) -> int:
        return len(self.held)
