"""Admission, as room in the active view allows: how many peers this node seeks, whether a node
may be admitted, and whom a newcomer may take the place of in a full table (docs/security.md:
the per-subnet limits, the protected quarters, the settled peers)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .dialing import Dials
from .peer import Peer
from .settings import DiscoverySettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)


class Room:
    """The rules on room in the active view. It reads the peer table and the verifications in
    flight (each may become a peer); Membership changes them."""

    def __init__(self, settings: DiscoverySettings, peers: Mapping[bytes, Peer], dials: Dials) -> None:
        self.settings = settings
        self._peers = peers
        self._dials = dials

    @property
    def target(self) -> int:
        """How many peers this node seeks (`active_view`, never more than it may hold)."""
        return min(self.settings.active_view, self.settings.max_peers)

    def seeking(self) -> bool:
        """Fewer peers than the target, counting the verifications in flight (each may become one)."""
        return len(self._peers) + len(self._dials.learned) < self.target

    def welcome(self, returning: bool) -> bool:
        """Whether a node that answered our challenge gets in (room permitting, max_peers):
        while we are below the target; one more, if it is `returning`: a newcomer we sent
        elsewhere before and it is back, so still short of peers. Without that slack two nodes
        one peer short each, already peers of each other, would wait forever; with more of it,
        or for anyone, the first nodes everyone joins through fill up and the latecomers find
        no room."""
        kept = len(self._peers) + self._dials.committed
        if kept >= self.settings.max_peers:
            return False
        return kept < self.target or (kept == self.target and returning)

    def no_room_for(self, subnet: str | None, now: float, *, newcomer: bool = False) -> str | None:
        """Why a node from `subnet` could not be admitted now, or None. A `newcomer` (it dialled
        us) is not refused for a full table before it is verified: it is redirected then."""
        if subnet is not None and self.subnet_counts()[subnet] >= self.settings.max_peers_per_subnet:
            return "refused_subnet"
        if not newcomer and len(self._peers) >= self.settings.max_peers and self.displaceable(subnet, now) is None:
            return "refused_full"
        return None

    def displaceable(self, subnet: str | None, now: float) -> Peer | None:
        """The peer a newcomer from `subnet` may displace from a full table: the youngest of the
        most crowded subnet, if that holds at least two more peers than the newcomer's, and
        never a settled one (`unsettled`)."""
        counts = self.subnet_counts()
        if not counts:
            return None
        crowded, most = counts.most_common(1)[0]
        if most < counts[subnet] + 2:
            return None
        victims = [p for p in self.unsettled(now) if p.subnet == crowded]
        return victims[-1] if victims else None

    def surplus_peer(self, now: float) -> Peer | None:
        """A peer that has more than the target without us (its latest PEERS says so) and is not
        settled (`unsettled`): the one a newcomer that came back, still short of peers, may take
        the place of. Nobody falls below the target for it, so this cannot start a chain of nodes
        pushing each other out. The surplus is what the peer's PEERS say, and Sybils can give it
        one by being sent on to it: hence never a settled peer (#14)."""
        spare = [p for p in self.unsettled(now) if p.reported_peers - 1 >= self.target]
        return max(spare, key=lambda p: p.reported_peers, default=None)

    def unsettled(self, now: float) -> list[Peer]:
        """The peers a newcomer may ever take the place of, longest-lived first: admitted less
        than `settled_after_s` ago, and not in the longest-lived or fastest-answering quarter of
        the table. A settled peer is never displaced, however many keys and subnets a newcomer
        has: it leaves only by its own silence or BYE."""
        quarter = max(1, self.settings.max_peers // 4)
        by_age = sorted(self._peers.values(), key=lambda p: p.admitted_at)
        by_rtt = sorted(self._peers.values(), key=lambda p: float("inf") if p.rtt_s is None else p.rtt_s)
        protected = {p.key for p in by_age[:quarter]} | {p.key for p in by_rtt[:quarter]}
        young = now - self.settings.settled_after_s
        return [p for p in by_age if p.admitted_at > young and p.key not in protected]

    def subnet_counts(self) -> Counter[str]:
        return Counter(peer.subnet for peer in self._peers.values() if peer.subnet is not None)
