"""Which ready peers this node learns with: those that learn with the same algorithm over the
same classes (their HELLO's capabilities say so, `learning_verdict`); the others are named."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..discovery.capabilities import labels_capability, learning_verdict
from .algorithm import class_list_text

if TYPE_CHECKING:
    from ..discovery.peers import Peer
    from .settings import DataSettings

__all__ = ["LearningPeers"]

log = logging.getLogger("p2pnode.node")


class LearningPeers:
    """`ready()`: the peers that admitted this node (Membership.ready); `algorithm`: the one
    this node learns with; `data`: its [data], whose class list peers must share."""

    def __init__(self, ready: Callable[[], Iterable[Peer]], algorithm: str, data: DataSettings, max_peers: int) -> None:
        self.ready, self.algorithm, self.max_peers = ready, algorithm, max_peers
        self.class_names = data.class_names  # named in the warning when a peer's differ
        # Its own data's class list fingerprint (HELLO announces it too); none on benchmark data.
        self.labels = labels_capability(data.class_names if data.path else ())
        self._warned: set[str] = set()  # peers already named as learning otherwise

    def chosen(self) -> dict[str, str]:
        """The peers to send learning payloads to and wait for, node id → address: ready ones
        that learn as this node does. The others are named in the log, once each (`excluded`)."""
        self.excluded()
        return {
            peer.node_id: peer.address
            for peer in self.ready()
            if learning_verdict(self.algorithm, self.labels, peer.capabilities) is None
        }

    def excluded(self) -> dict[str, str]:
        """Ready peers that are not learning peers, each with why (`status` shows them); a peer
        that learns otherwise is named in a warning, once."""
        excluded = {}
        for peer in self.ready():
            why = learning_verdict(self.algorithm, self.labels, peer.capabilities)
            if why is None:
                continue
            excluded[peer.node_id] = why
            if why.startswith("runs no") or peer.node_id in self._warned:
                continue  # a peer that only relays is no surprise
            if len(self._warned) >= self.max_peers:
                self._warned.clear()  # bounded: at worst a warning is repeated
            self._warned.add(peer.node_id)
            hint = (
                f"; this node's [data].class_names: {class_list_text(self.class_names)} (every node of a network "
                "lists the same names in the same order; each node logs its class list's labels: at start)"
                if why.startswith("learns over other classes")
                else " ([algorithm].name and [data] must agree on every node that learns together)"
            )
            log.warning("peer %s is not a learning peer: it %s%s", peer.node_id, why, hint)
        return excluded
