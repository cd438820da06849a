"""What a node does with relaying frames (protocol RELAY_TYPES) and what it sends of its own:
the relay's reservations (book.py) and a client node's relays (client.py). Pure: it returns
what to send, (address, body), and the node signs and sends it.

So far reservations only: a client holds places at relays and a relay keeps them; frames
through relays (RELAY, RELAYED, UNRELAYED), connection reversal (REVERSE) and REACH are refused
as `not_relay` until they are built (docs/daemon.md, "Relays").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from protocol import Body, Envelope, MessageType, Reserve, Reserved, node_id

from ..discovery.peer import Peer
from ..metrics import NOT_RELAY, RESERVED_UNEXPECTED
from .book import Reservations
from .client import RelayChoice
from .settings import RelaySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["RelayService"]

Sends = list[tuple[str, Body]]


class RelayService:
    def __init__(self, settings: RelaySettings, client_mode: bool) -> None:
        self.settings = settings
        self.counts: Counter[str] = Counter()
        self.book = Reservations(settings, self.counts)
        wants = client_mode and settings.reservations > 0
        self.choice = RelayChoice(settings, self.counts) if wants else None

    def on_message(self, envelope: Envelope, peer: Peer, now: float) -> tuple[str | None, Sends]:
        """A relaying frame from admitted `peer`: the refusal to count (or None) and what to send."""
        body = envelope.body
        if envelope.type is MessageType.RESERVE:
            granted, refused = self.book.request(peer.key, peer.subnet, body.ttl_s, now)
            return None, [(peer.address, Reserved(ttl_s=granted, refused=refused))]
        if envelope.type is MessageType.RESERVED:
            if self.choice is None or not self.choice.answered(peer.key, body.ttl_s, body.refused, now):
                return RESERVED_UNEXPECTED, []
            return None, []
        return NOT_RELAY, []

    def tick(self, now: float, peers: Mapping[bytes, Peer], ready: list[Peer]) -> Sends:
        """Expire the places held here; on a client, the RESERVEs due (`peers`: the admitted
        peers; `ready`: those it may send to)."""
        self.book.expire(now, peers)
        if self.choice is None:
            return []
        ttl = int(self.settings.reservation_ttl_s)
        return [(address, Reserve(ttl_s=ttl)) for _, address in self.choice.due(ready, now)]

    def status(self, now: float) -> dict:
        """`status`'s `relay`: the places this relay holds, the relays this client holds, counts."""
        relays = [] if self.choice is None else self.choice.held.items()
        return {
            "enabled": self.settings.enabled,
            "holders": sorted(node_id(key) for key in self.book.held),
            "relays": [
                {"node_id": node_id(key), "address": held.address, "expires_in_s": round(held.expires_at - now, 1)}
                for key, held in sorted(relays)
            ],
            "counts": dict(sorted(self.counts.items())),
        }
