"""Whether this node can be reached at the address it advertises, from what it has seen (issue #46).

Every peer that admits this node first dials the address in this node's HELLO and sends a
challenge there: a challenge that arrives is a peer that reached it. That is the evidence for
`public`, once `confirmations` distinct peers have given it (one peer on the same LAN or host
says little about the rest of the network). The evidence for `private` is the other way round:
a bootstrap node took this node's connection (its handshake succeeded), so this node's frames
reach it, but never answered, and nobody has reached this node either: its answers go to an
address it cannot reach (a NAT, a firewall). Anything else is `unknown`.

While it is not `public`, the node also asks the nodes it reaches to dial it back at the host
they see its connection come from (dial_back.py): a dial-back at its advertised address is the
same evidence as a challenge; one at another address (a router's public one, where the router
forwards the port) says where the node could be reached instead (`reachable_at`), which `status`,
the log and `doctor` name.
"""

from __future__ import annotations

from collections import OrderedDict

from protocol.messages import is_client_address

PURE = True  # no I/O and no clock (tests/test_layering.py checks)

__all__ = ["PRIVATE", "PUBLIC", "UNKNOWN", "Reachability"]

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"
CLIENT = "client"  # `[node].client_mode`: nobody dials it, by design
MAX_REMEMBERED = 64  # keys and addresses kept, the oldest forgotten first: a stranger's keys cost nothing more
MAX_ADDRESSES = 8  # addresses dialled back at that are kept (a node has one or two)


class Reachability:
    def __init__(self, confirmations: int) -> None:
        self.confirmations = confirmations
        self._reached_by: OrderedDict[bytes, None] = OrderedDict()  # keys whose challenge arrived here
        self._unanswered: OrderedDict[str, None] = OrderedDict()  # bootstraps that took our connection, no answer
        self._dialled_at: OrderedDict[str, OrderedDict[bytes, None]] = OrderedDict()  # address → keys that dialled it

    def challenged(self, key: bytes) -> None:
        """`key`'s challenge arrived at this node's address."""
        _remember(self._reached_by, key)

    def reached_by_dial_back(self, key: bytes, address: str, *, advertised: bool) -> None:
        """`key` dialled this node back at `address` (its `advertised` one or not) and got through."""
        if advertised:
            self.challenged(key)
        keys = self._dialled_at.get(address)
        if keys is None:
            keys = self._dialled_at[address] = OrderedDict()
            while len(self._dialled_at) > MAX_ADDRESSES:
                self._dialled_at.popitem(last=False)
        _remember(keys, key)

    @property
    def dialled_back(self) -> dict[str, int]:
        """How many nodes dialled this node back and got through, by the address they dialled."""
        return {address: len(keys) for address, keys in self._dialled_at.items()}

    @property
    def reachable_at(self) -> list[str]:
        """The addresses where `confirmations` nodes dialled this node back and got through."""
        return [address for address, count in self.dialled_back.items() if count >= self.confirmations]

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
        if is_client_address(address):
            state = CLIENT
            why = f"client mode: it binds nothing and is reached over the connections it dials ({reached} peers so far)"
        elif state == PUBLIC:
            why = f"{reached} peers reached it at {address}"
        elif state == PRIVATE:
            why = (
                f"{', '.join(self._unanswered)} took its connection and never answered, and no peer reached it at "
                f"{address}: likely behind a NAT or a firewall (docs/deploy.md)"
            )
        else:
            why = f"{reached} of the {self.confirmations} peers needed reached it at {address} so far"
        elsewhere = {other: count for other, count in self.dialled_back.items() if other != address}
        if state not in (PUBLIC, CLIENT) and elsewhere:
            best, count = max(elsewhere.items(), key=lambda item: item[1])
            sure = "" if count >= self.confirmations else f" ({count} of the {self.confirmations} needed to be sure)"
            why += (
                f"; but nodes that dialled it back reached it at {best}{sure}: advertise that "
                "([node].advertise, and its peers' port forwarded too: [node].peer_advertise_port)"
            )
        return {
            "state": state,
            "address": address,
            "reached_by": reached,
            "needed": self.confirmations,
            "unanswered_bootstraps": list(self._unanswered),
            "dialled_back": self.dialled_back,
            "reachable_at": self.reachable_at,
            "why": why,
        }


def _remember(seen: OrderedDict, item) -> None:
    seen[item] = None
    seen.move_to_end(item)
    while len(seen) > MAX_REMEMBERED:
        seen.popitem(last=False)
