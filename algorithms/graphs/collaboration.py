"""Whom a node collaborates with, and how much: one row of the collaboration matrix W.

Two neighbourhoods, one interface, so an algorithm is composed with either:

- `UniformGraph`: every peer is a neighbour and everyone (the node too) weighs the same.
- `LearnedGraph`: MAPL's CGL. Uniform until warm-up ends; then the row is learned from how
  similar the peers' classifier heads are (algorithms/graphs/graph.py), zero weights drop peers, and
  every few rounds a few non-neighbours are tried again (exploration), so a zero is not final.

Either way, a peer the node distrusts (its payloads refused: algorithms/outliers.py) is absent
from the row, and the weight it would hold is the node's own. The learned row gets it as a
stand-in for the node: a candidate as similar as the node itself, whose weight the node keeps.
A neighbour that left the learned row (it went, or was evicted) stands in as a candidate at the
similarity it last had, its weight the node's own: losing its only cluster-mate never hands a
node to strangers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from protocol.messages import MessageType

from ..interface import NeighbourView, uniform_row
from ..outliers import ScaleGuard, fold_into_self
from .graph import GraphConfig, GraphOptimizer

__all__ = ["UniformGraph", "LearnedGraph", "InNeighbourhood", "REMEMBER_ABSENT"]

# Neighbours no longer heard, remembered with their last similarity (LearnedGraph.absent).
REMEMBER_ABSENT = 64


class UniformGraph:
    """Every peer is a neighbour; W's row is uniform over the node and its peers."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.peers: tuple[str, ...] = ()
        self.w: dict[str, float] = {node_id: 1.0}
        self.distrusted: frozenset[str] = frozenset()

    def set_peers(self, peers: Iterable[str]) -> None:
        self.peers = tuple(peers)
        self.w = uniform_row(self.node_id, self.peers)

    def distrust(self, peers: Iterable[str]) -> None:
        """The peers whose payloads the node refuses now: the weight each would hold is the
        node's own, not shared out among the others. One that left holds no weight, but a
        learned row still stands in for it (`LearnedGraph.step`)."""
        self.distrusted = frozenset(peers) - {self.node_id}

    def learning(self, round: int) -> bool:
        """Whether `round` learns the row (and so needs the peers' heads)."""
        return False

    def weights(self) -> dict[str, float]:
        row = fold_into_self(self.w, self.node_id, self.distrusted)
        total = sum(row.values())
        if total <= 0:
            # A learned row that gave the node itself nothing, and whose neighbours have all left
            # (every router forgot its connections at once): the node alone until the next step.
            return {self.node_id: 1.0}
        return {node: weight / total for node, weight in row.items()}

    def neighbours(self) -> tuple[str, ...]:
        return tuple(node for node, weight in self.weights().items() if weight > 0 and node != self.node_id)

    def targets(self, round: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(neighbours, explored non-neighbours) that this round's payloads go to."""
        return self.neighbours(), ()

    def mixing(self, arrived: Iterable[str], decay: Mapping[str, float] | None = None) -> dict[str, float]:
        """Weights over the node and the neighbours whose payload arrived, each w_ij times its
        payload's staleness weight λ^age (`decay`, NeighbourView.decay; 1 if absent), renormalised
        to sum 1 (a distrusted peer's weight stays with the node: it did not arrive, it was refused).
        This is the one place the async schedule's staleness rule weighs a payload."""
        row, decay = self.weights(), decay or {}
        mix = {self.node_id: row.get(self.node_id, 0.0)}
        mix.update({peer: row[peer] * decay.get(peer, 1.0) for peer in arrived if row.get(peer, 0.0) > 0})
        total = sum(mix.values())
        if total <= 0:
            return {self.node_id: 1.0}
        return {node: weight / total for node, weight in mix.items()}

    def step(self, similarity: Mapping[str, float], sizes: Mapping[str, float]) -> None:
        """A uniform row learns nothing."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class LearnedGraph(UniformGraph):
    """CGL: projected steps on w over the node and the peers whose heads it holds."""

    def __init__(
        self,
        node_id: str,
        config: GraphConfig,
        *,
        warmup_rounds: int,
        explore_every: int,
        explore_peers: int,
        seed: int,
    ) -> None:
        super().__init__(node_id)
        self.optimizer = GraphOptimizer(config)
        self.warmup_rounds = warmup_rounds
        self.explore_every = explore_every
        self.explore_peers = explore_peers
        self.learned = False
        self.explore_rng = np.random.default_rng([seed, 2])
        self.similar: dict[str, float] = {}  # each peer's latest similarity, once scored
        # Neighbours that left (or were evicted) with their last similarity: each stands in as a
        # candidate whose weight the node keeps (`step`) until heard again; the one that went
        # first is forgotten first, past REMEMBER_ABSENT. (Not one whose heads stopped coming:
        # rows are not symmetric, and a neighbour that does not weigh this node sends it none.)
        self.absent: dict[str, float] = {}

    def set_peers(self, peers: Iterable[str]) -> None:
        if not self.learned:  # before the row is learned everyone is a neighbour, uniformly
            super().set_peers(peers)
            return
        self.peers = tuple(peers)
        known = set(self.peers)
        self._note_absent([peer for peer in self.w if peer not in known and peer != self.node_id])
        self.similar = {peer: s for peer, s in self.similar.items() if peer in known or peer in self.absent}
        self.w = {node: weight for node, weight in self.w.items() if node == self.node_id or node in known}

    def _note_absent(self, gone: Iterable[str]) -> None:
        """Of the peers `gone`, the neighbours (weight in the row, a similarity known, trusted)
        are absent from now on."""
        for peer in gone:
            if self.w.get(peer, 0.0) > 0 and peer in self.similar and peer not in self.distrusted:
                self.absent.pop(peer, None)
                self.absent[peer] = self.similar[peer]
        while len(self.absent) > REMEMBER_ABSENT:
            del self.absent[next(iter(self.absent))]

    def learning(self, round: int) -> bool:
        return round >= self.warmup_rounds

    def targets(self, round: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if not self.learning(round):
            return self.peers, ()
        neighbours = self.neighbours()
        outsiders = sorted(set(self.peers) - set(neighbours))
        if not (self.explore_peers and outsiders and (round - self.warmup_rounds) % self.explore_every == 0):
            return neighbours, ()
        # Without this a zero weight is final: a peer we no longer hear from is never re-scored.
        count = min(self.explore_peers, len(outsiders))
        chosen = self.explore_rng.choice(len(outsiders), size=count, replace=False)
        return neighbours, tuple(sorted(outsiders[i] for i in chosen))

    def step(self, similarity: Mapping[str, float], sizes: Mapping[str, float]) -> None:
        """One graph step from the heads' similarity to ours, s_ij per peer j, and the dataset
        sizes n_j (the node's own included) that weigh them.

        A distrusted peer is no candidate, but it still bounds the similarity normalisation as
        if it were as similar as the node itself (ceiling 1): left out entirely, the node's most
        similar strangers would become the most similar peers it has, and the normalisation and
        the degree term would hand them the weight of the cluster-mate it cannot trust (digits,
        2 nodes per cluster: 0.69 of a row). As a candidate standing in for the node, it took
        weight from the trusted cluster-mates of every node that refused it, its strangers
        included (0.65 on the node itself instead of 0.5).

        A neighbour that left (`absent`) is a candidate at its last similarity, and the weight it
        gets is the node's own: the row is learned as if it were still there.
        Left out, it handed the row to strangers the same way: under a barrage each honest node
        of 4 daemons evicted its only cluster-mate (liveness, the node too busy) and put 0.54 of
        its row on the other cluster's node; as a bound on the normalisation alone (a stand-in
        like a distrusted peer's) the strangers still kept 0.13 (the norm term spreads a row)."""
        for peer in similarity:  # heard again
            self.absent.pop(peer, None)
        trusted = sorted(similarity.keys() - self.distrusted)
        if not trusted and self.learned:
            # No evidence this round (e.g. the node was down or jumped ahead): keep the graph
            # rather than fall back to talking to no one, which nobody could undo.
            return
        absent = [peer for peer in self.absent if peer not in self.distrusted]
        candidates = [self.node_id, *trusted, *absent]
        scores = np.array([1.0] + [similarity[peer] for peer in trusted] + [self.absent[peer] for peer in absent])
        own = sizes[self.node_id]
        counts = np.array([sizes.get(node, own) for node in candidates])
        start = np.array([self.w.get(node, 0.0) for node in candidates])
        if start.sum() <= 0:
            start = np.full(len(candidates), 1.0 / len(candidates))
        stand_in = 1.0 if self.distrusted else 0.0
        new = self.optimizer.step(candidates, start, scores, counts / counts.sum(), 0, stand_in=stand_in)
        self.similar.update({peer: similarity[peer] for peer in trusted})
        self.w = fold_into_self(dict(zip(candidates, new.tolist(), strict=True)), self.node_id, absent)
        self.learned = True

    def state_dict(self) -> dict[str, Any]:
        return {
            "w": dict(self.w),
            "graph_learned": self.learned,
            "graph_moments": [dict(self.optimizer.first_moment), dict(self.optimizer.second_moment)],
            "graph_step_count": self.optimizer.step_count,
            "explore_rng": self.explore_rng.bit_generator.state,
            "graph_similar": dict(self.similar),
            "graph_absent": dict(self.absent),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            self.w = {str(k): float(v) for k, v in state["w"].items()}
            self.learned = bool(state["graph_learned"])
            first, second = state["graph_moments"]
            self.optimizer.first_moment, self.optimizer.second_moment = dict(first), dict(second)
            self.optimizer.step_count = int(state["graph_step_count"])
            self.explore_rng.bit_generator.state = state["explore_rng"]
            # absent from checkpoints written before they were kept
            self.similar = {str(k): float(v) for k, v in state.get("graph_similar", {}).items()}
            self.absent = {str(k): float(v) for k, v in state.get("graph_absent", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the saved graph state does not fit: {exc}") from None


class InNeighbourhood:
    """Mixed into an Algorithm that keeps a neighbourhood (`graph`), a view of what its peers
    sent (`view`) and a check of its scale (`guard`): peers, its row of W, whom a round waits
    for, and the graph in checkpoints.
    `heard_by` is the payload type every neighbour sends every round."""

    node_id: str
    peers: tuple[str, ...]
    graph: UniformGraph
    view: NeighbourView
    guard: ScaleGuard
    heard_by: ClassVar[MessageType]

    def set_peers(self, peers: Iterable[str]) -> None:
        super().set_peers(peers)
        self.view.set_peers(self.peers)
        self.guard.set_peers(self.peers)
        self.graph.set_peers(self.peers)
        self.graph.distrust(self.guard.distrusted())

    def after_judging(self) -> None:
        """A peer's payload was judged (Algorithm.receive): the graph is told whom the node
        distrusts now."""
        self.graph.distrust(self.guard.distrusted())

    def weights(self) -> dict[str, float]:
        return self.graph.weights()

    def neighbours(self) -> tuple[str, ...]:
        return self.graph.neighbours()

    def expected(self, round: int) -> tuple[str, ...]:
        """Everyone at round 0; afterwards the neighbours that sent last round. A peer sends only
        if it gives us weight, which we cannot see, and a peer that stopped (finished, died, or
        cut us) should cost one wait, not one per round; one that cut us says so (the round
        engine's PASS), and costs none."""
        if round == 0:
            return self.peers
        neighbours = set(self.graph.neighbours())
        return tuple(p for p in self.view.senders_since(self.heard_by, round - 1) if p in neighbours)

    def mixing(self, kind: MessageType, round: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The neighbours' fresh payloads of `kind` and the row to mix them with: W's, over the
        node and those payloads, weighted by their age (Staleness), renormalised."""
        payloads = self.view.fresh(kind, round)
        return payloads, self.graph.mixing(payloads, self.view.decay(kind, round))

    def mix_models(self, shared: Any, round: int) -> None:
        """Mix `shared` (payloads.SharedModules, small.SmallShare) with the neighbours' fresh MODEL
        payloads: own ← w_ii · own + Σ_j w_ij · theirs, over those that arrived, renormalised."""
        models, mix = self.mixing(MessageType.MODEL, round)
        own_weight = mix.pop(self.node_id)
        shared.mix(own_weight, [(weight, models[peer]) for peer, weight in mix.items()])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.graph.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.graph.load_state_dict(state)
