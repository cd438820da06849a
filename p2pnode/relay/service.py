"""What a node does with relaying frames (protocol RELAY_TYPES) and what it sends of its own:
the relay's reservations (book.py) and circuits (circuits.py), a client node's relays
(client.py). Pure: it returns what to send, (address, body), and the node signs and sends it.
A RELAYED, and a REVERSE, are the link's (link.py): the frame inside is the receive path's or
membership's; the relay's bookkeeping of reversals is here. REACH is not built yet: refused
as `not_relay`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from protocol import Body, Envelope, MessageType, Relayed, Reserve, Reserved, Reverse, Unrelayed, node_id

from ..discovery.peer import Peer
from ..metrics import NOT_RELAY, RESERVED_UNEXPECTED
from .book import Reservations
from .circuits import CircuitBook
from .client import RelayChoice
from .settings import RelaySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["RelayService"]

Sends = list[tuple[str, Body]]
UNRELAYED_EVERY_S = 1.0  # UNRELAYEDs to one origin about one target, at most
REVERSAL_EVERY_S = 30.0  # reversals one node asks of one client, at most
MAX_REVERSALS = 64  # reversals the relay passes on per minute, in all


class RelayService:
    def __init__(self, settings: RelaySettings, client_mode: bool) -> None:
        self.settings = settings
        self.counts: Counter[str] = Counter()
        self.book = Reservations(settings, self.counts)
        self.circuits = CircuitBook(settings, self.book, self.counts)
        self._unrelayed_at: dict[tuple[bytes, bytes], float] = {}
        self._reversed_at: dict[tuple[bytes, bytes], float] = {}  # (asker, client) -> when last passed on
        wants = client_mode and settings.reservations > 0
        self.choice = RelayChoice(settings, self.counts) if wants else None

    def on_message(
        self, envelope: Envelope, peer: Peer, peers: Mapping[bytes, Peer], now: float
    ) -> tuple[str | None, Sends]:
        """A relaying frame from admitted `peer` (`peers`: all of them): the refusal to count (or
        None) and what to send."""
        body = envelope.body
        if envelope.type is MessageType.RELAY:
            if not self.settings.enabled:  # refused unanswered: a node that relays for nobody says nothing
                return NOT_RELAY, []
            return None, self._relay(peer, body.target, body.sealed, peers, now)
        if envelope.type is MessageType.UNRELAYED:
            self.counts[f"unrelayed_by_relay_{body.reason}"] += 1
            return None, []
        if envelope.type is MessageType.RESERVE:
            granted, refused = self.book.request(peer.key, peer.subnet, body.ttl_s, now)
            return None, [(peer.address, Reserved(ttl_s=granted, refused=refused))]
        if envelope.type is MessageType.RESERVED:
            if self.choice is None or not self.choice.answered(peer.key, body.ttl_s, body.refused, now):
                return RESERVED_UNEXPECTED, []
            return None, []
        return NOT_RELAY, []

    def _relay(self, origin: Peer, target: bytes, sealed: bytes, peers: Mapping[bytes, Peer], now: float) -> Sends:
        refusal = self.circuits.forward(origin.key, target, len(sealed), peers, now)
        if refusal is None:
            return [(peers[target].address, Relayed(origin=origin.key, sealed=sealed))]
        pair = (origin.key, target)
        if now - self._unrelayed_at.get(pair, -UNRELAYED_EVERY_S) < UNRELAYED_EVERY_S:
            return []
        if len(self._unrelayed_at) >= 4 * self.settings.max_circuits:
            self._unrelayed_at.clear()
        self._unrelayed_at[pair] = now
        return [(origin.address, Unrelayed(target=target, reason=refusal))]

    def reversal(
        self, source: Peer, target: bytes, hello: bytes, peers: Mapping[bytes, Peer], now: float
    ) -> tuple[str | None, Sends]:
        """REVERSE from peer `source` (its own HELLO frame `hello`, checked by the link): passed on
        to `target` if it holds a place here, once per REVERSAL_EVERY_S per asker and client and
        MAX_REVERSALS a minute in all; else the refusal to count."""
        if not self.settings.enabled:
            return NOT_RELAY, []
        if target not in peers or not self.book.holds(target, now):
            return "reversal_no_reservation", []
        pair = (source.key, target)
        recent = {pair: at for pair, at in self._reversed_at.items() if now - at < 60.0}
        self._reversed_at = recent
        if now - recent.get(pair, -REVERSAL_EVERY_S) < REVERSAL_EVERY_S or len(recent) >= MAX_REVERSALS:
            return "reversal_rate", []
        self._reversed_at[pair] = now
        self.counts["reversals"] += 1
        return None, [(peers[target].address, Reverse(target=target, hello=hello))]

    def holders(self, now: float) -> list[bytes]:
        """The client nodes this relay holds a live place for: it tells its peers of them (PEERS)."""
        return [key for key in self.book.held if self.book.holds(key, now)]

    def tick(self, now: float, peers: Mapping[bytes, Peer], ready: list[Peer]) -> Sends:
        """Expire the places held here; on a client, the RESERVEs due (`peers`: the admitted
        peers; `ready`: those it may send to)."""
        self.book.expire(now, peers)
        self.circuits.close_idle(now, peers)
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
            "circuits": len(self.circuits.circuits),
            "relays": [
                {"node_id": node_id(key), "address": held.address, "expires_in_s": round(held.expires_at - now, 1)}
                for key, held in sorted(relays)
            ],
            "counts": dict(sorted(self.counts.items())),
        }
