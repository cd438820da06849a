"""A client node's relays: which of its peers hold a reservation for it, and when to ask again.

It asks peers that announce the capability `relay` (and can be dialled: a client relays for
nobody), in distinct subnets where it can, the longest-admitted first, then the nearest; it
renews each place halfway through its time, and leaves a relay that refused or did not answer
alone for `[relay].retry_s`. A relay that stops being a peer is replaced at the next tick.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from protocol.messages import RELAY_CAPABILITY, is_client_address

from ..discovery.peer import Peer
from .settings import RelaySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["HeldRelay", "RelayChoice", "is_relay"]

ANSWER_WITHIN_S = 10.0  # a RESERVE unanswered this long counts as refused


@dataclass
class HeldRelay:
    address: str
    expires_at: float
    renew_at: float


def is_relay(peer: Peer) -> bool:
    return RELAY_CAPABILITY in peer.capabilities and not is_client_address(peer.address)


class RelayChoice:
    def __init__(self, settings: RelaySettings, counts: Counter[str]) -> None:
        self.settings = settings
        self.counts = counts
        self.held: dict[bytes, HeldRelay] = {}
        self.asked: dict[bytes, tuple[str, float]] = {}  # relay key → (its address, when asked)
        self.resting: dict[bytes, float] = {}  # relay key → until when it is not asked

    def due(self, ready: list[Peer], now: float) -> list[tuple[bytes, str]]:
        """The relays to send RESERVE to now, (key, address): renewals due, and new relays while
        fewer than `[relay].reservations` are held or asked. `ready` are the node's ready peers."""
        relays = {peer.key: peer for peer in ready if is_relay(peer)}
        self._forget(relays, now)
        asks = [
            (key, held.address) for key, held in self.held.items() if now >= held.renew_at and key not in self.asked
        ]
        room = self.settings.reservations - len(self.held.keys() | self.asked.keys())
        if room > 0:
            asks += [(peer.key, peer.address) for peer in self._pick(relays, room, now)]
        for key, address in asks:
            self.asked[key] = (address, now)
        return asks

    def answered(self, key: bytes, ttl_s: int, refused: str | None, now: float) -> bool:
        """RESERVED from `key`: False if this node asked it nothing."""
        asked = self.asked.pop(key, None)
        if asked is None:
            return False
        if refused is not None or ttl_s == 0:
            self.held.pop(key, None)
            self.resting[key] = now + self.settings.retry_s
            self.counts[f"reservation_refused_{refused or 'no_time'}"] += 1
            return True
        renewed = key in self.held
        self.held[key] = HeldRelay(asked[0], now + ttl_s, now + ttl_s / 2)
        self.counts["reservation_renewed" if renewed else "reservation_held"] += 1
        return True

    def _forget(self, relays: dict[bytes, Peer], now: float) -> None:
        """Drop relays no longer among the peers, places expired, asks unanswered, rests over."""
        for key in [key for key, held in self.held.items() if key not in relays or held.expires_at <= now]:
            del self.held[key]
            self.counts["relay_lost"] += 1
        for key in [key for key, (_, at) in self.asked.items() if key not in relays or now - at > ANSWER_WITHIN_S]:
            del self.asked[key]
            self.resting[key] = now + self.settings.retry_s
            self.counts["reservation_unanswered"] += 1
        self.resting = {key: until for key, until in self.resting.items() if until > now}

    def _pick(self, relays: dict[bytes, Peer], room: int, now: float) -> list[Peer]:
        """Up to `room` new relays: a subnet not yet used first, then the longest admitted, the nearest."""
        taken = self.held.keys() | self.asked.keys() | self.resting.keys()
        used = {relays[key].subnet for key in self.held.keys() | self.asked.keys() if key in relays}
        free = sorted(
            (peer for key, peer in relays.items() if key not in taken),
            key=lambda peer: (peer.admitted_at, peer.rtt_s if peer.rtt_s is not None else float("inf")),
        )
        picked: dict[bytes, Peer] = {}
        for fresh_subnet_only in (True, False):
            for peer in free:
                if len(picked) < room and peer.key not in picked and not (fresh_subnet_only and peer.subnet in used):
                    picked[peer.key] = peer
                    used.add(peer.subnet)
        return list(picked.values())
