"""Whether this node can be reached at the address it advertises, from what it has seen (issue #46).

Every peer that admits this node first dials the address in this node's HELLO and sends a
challenge there: a challenge that arrives is a peer that reached it. That is the evidence for
`public`, once `confirmations` distinct peers have given it (one peer on the same LAN or host
says little about the rest of the network). The evidence for `private` is the other way round:
a bootstrap node took this node's connection (its handshake succeeded), so this node's frames
reach it, but never answered, and nobody has reached this node either: its answers go to an
address it cannot reach (a NAT, a firewall). Anything else is `unknown`. The node only watches
what admission does anyway; it asks no peer to dial it back, so it tests the address it
advertises, not the one a router shows its peers.
"""

from __future__ import annotations

from collections import OrderedDict

PURE = True  # no I/O and no clock (tests/test_layering.py checks)

__all__ = ["PRIVATE", "PUBLIC", "UNKNOWN", "Reachability"]

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"
MAX_REMEMBERED = 64  # keys and addresses kept, the oldest forgotten first: a stranger's keys cost nothing more


class Reachability:
    def __init__(self, confirmations: int) -> None:
        self.confirmations = confirmations
        self._reached_by: OrderedDict[bytes, None] = OrderedDict()  # keys whose challenge arrived here
        self._unanswered: OrderedDict[str, None] = OrderedDict()  # bootstraps that took our connection, no answer

    def challenged(self, key: bytes) -> None:
        """`key`'s challenge arrived at this node's address."""
        _remember(self._reached_by, key)

    def unanswered(self, address: str) -> None:
        """The bootstrap at `address` took this node's connection but never answered it."""
        _remember(self._unanswered, address)

    @property
    def state(self) -> str:
        if len(self._reached_by) >= self.confirmations:
            return PUBLIC
        if self._unanswered and not self._reached_by:
            return PRIVATE
        return UNKNOWN

    def describe(self, address: str) -> dict:
        """`status`'s `reachability` of a node advertising `address`: the state, its evidence, and
        why in words."""
        state, reached = self.state, len(self._reached_by)
        if state == PUBLIC:
            why = f"{reached} peers reached it at {address}"
        elif state == PRIVATE:
            why = (
                f"{', '.join(self._unanswered)} took its connection and never answered, and no peer reached it at "
                f"{address}: likely behind a NAT or a firewall (docs/deploy.md)"
            )
        else:
            why = f"{reached} of the {self.confirmations} peers needed reached it at {address} so far"
        return {
            "state": state,
            "address": address,
            "reached_by": reached,
            "needed": self.confirmations,
            "unanswered_bootstraps": list(self._unanswered),
            "why": why,
        }


def _remember(seen: OrderedDict, item) -> None:
    seen[item] = None
    seen.move_to_end(item)
    while len(seen) > MAX_REMEMBERED:
        seen.popitem(last=False)
