"""The passive view: nodes that are no peers, known by their signed HELLOs, from which this node
replaces a peer that leaves (HyParView). Bounded (`passive_view`); only addresses someone
verified enter it, so that a lying peer cannot fill it with addresses nobody answers at."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from protocol import Envelope

from .actions import Informant
from .peer import Peer
from .settings import DiscoverySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)


@dataclass
class Known:
    """A passive-view entry: a node that is no peer, its signed HELLO, who told us of it, the
    earliest time it is worth dialling (a node that said it is full is not asked again at once)
    and when it is forgotten (`hello_max_age_s` after it was heard, unless a newer HELLO came)."""

    hello: Envelope
    frame: bytes
    informant: Informant
    not_before: float
    expires_at: float


class Passive(Mapping[bytes, Known]):
    """The passive view, by key. It reads the peer table (a peer is kept out of it)."""

    def __init__(self, own_key: bytes, settings: DiscoverySettings, peers: Mapping[bytes, Peer]) -> None:
        self.own_key = own_key
        self.settings = settings
        self._peers = peers
        self._known: dict[bytes, Known] = {}  # key -> its latest signed HELLO

    def __getitem__(self, key: bytes) -> Known:
        return self._known[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)

    def remember(
        self,
        hello: Envelope,
        frame: bytes,
        informant: Informant,
        now: float,
        rng: random.Random,
        *,
        wait: float = 0.0,
    ) -> None:
        """Keep a relayed (so verified by the peer that relayed it) or demoted peer's HELLO in
        the passive view. When it is full, an entry from the informant with the most entries
        (this one's, in a tie) makes room, so that one lying peer cannot fill it with addresses
        nobody answers at."""
        key = hello.sender
        if not isinstance(informant, bytes) and informant != "demoted":
            return  # a stranger's own HELLO or a beacon: nobody verified that address
        if key == self.own_key or key in self._peers:
            return
        known = self._known.get(key)
        if known is not None and known.hello.timestamp_us >= hello.timestamp_us:
            return  # the same or an older HELLO: the first informant keeps it
        if known is None and len(self._known) >= self.settings.passive_view:
            counts = Counter(entry.informant for entry in self._known.values())
            crowded = informant if counts[informant] == max(counts.values()) else counts.most_common(1)[0][0]
            victims = [k for k, entry in self._known.items() if entry.informant == crowded]
            del self._known[rng.choice(victims)]
        self._known[key] = Known(hello, frame, informant, now + wait, now + self.settings.hello_max_age_s)

    def due(self, now: float, rng: random.Random) -> list[bytes]:
        """The keys worth dialling at `now`, in random order."""
        keys = [key for key, entry in self._known.items() if entry.not_before <= now]
        rng.shuffle(keys)
        return keys

    def earliest(self) -> float:
        """When the first entry is worth dialling."""
        return min(entry.not_before for entry in self._known.values())

    def forget(self, key: bytes) -> None:
        self._known.pop(key, None)
