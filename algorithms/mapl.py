"""MAPL (Mukherjee, Simonetto & Jamali-Rad): personalised models on heterogeneous backbones,
plus a learned collaboration graph. Also its no-communication relatives, Local and Oracle.

Per round: a PML local step (supervised contrastive + cross-entropy + sample-to-prototype +
prototype uniformity, on two augmented views), then prototypes go to the current neighbours;
after warm-up the classifier head rides along every `head_every` rounds (in the same PROTOTYPES
frame) and CGL updates the weight vector from head similarity. Prototypes are aggregated with those weights every round, warm-up included:
ξ_i ← w_ii ξ_i + Σ_j w_ij ξ_j. Only heads and prototypes cross between nodes; MAPL+ (same
backbone everywhere) also averages backbone and projector with the learned weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from protocol.messages import Body, Head, MessageType, Model, Prototypes

from .augment import default_augment, two_views
from .graph import GraphConfig, GraphOptimizer, head_similarity
from .losses import prototype_alignment, prototype_uniformity, supervised_contrastive
from .models import ModelSpec, make_model
from .payloads import average_states, check_head, check_model, check_prototypes, shared_state, to_numpy
from .seam import Algorithm, Frame, LocalReport, NeighbourView, NodeSetup, Outbound, PayloadRejected
from .training import LocalTrainer, TrainedLocally, TrainingConfig, seeded_generator

__all__ = ["MaplConfig", "Mapl", "MaplNoCgl", "MaplPlus", "Local", "Oracle"]


@dataclass(frozen=True)
class MaplConfig:
    training: TrainingConfig = field(default_factory=TrainingConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    latent_dim: int = 128
    projection_dim: int = 128
    supcon_temperature: float = 100.0  # the public code's value
    prototype_temperature: float = 1.0  # effective value in the public code (its τ cancels)
    uniformity_temperature: float = 100.0
    weight_supcon: float = 1.0
    weight_cross_entropy: float = 1.0
    weight_prototype: float = 1.0
    weight_uniformity: float = 1.0
    warmup_rounds: int = 20  # all-to-all uniform graph until then; the paper uses 100 of 400
    max_staleness: int = 1  # rounds a payload stays usable
    explore_every: int = 5  # after warm-up, every k rounds also publish to a few non-neighbours
    explore_peers: int = 1  # ... this many; 0 disables exploration
    # After warm-up the head rides on the prototypes every k rounds (and always to an explored
    # peer); a head stays usable for k − 1 + max_staleness rounds. Heads drift slowly, and this
    # keeps the head's bytes from doubling every message.
    head_every: int = 5
    shared_head_init: bool = True  # every node starts from the same head (seeded by the network)

    def __post_init__(self) -> None:
        if self.latent_dim < 1 or self.projection_dim < 1:
            raise ValueError("latent_dim and projection_dim must be ≥ 1")
        for name in ("supcon_temperature", "prototype_temperature", "uniformity_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.graph.similarity != "cosine" and not self.shared_head_init:
            raise ValueError(
                f"graph.similarity={self.graph.similarity} compares head updates since a common "
                "start: it needs shared_head_init=true"
            )
        if self.warmup_rounds < 0 or self.max_staleness < 0 or self.explore_peers < 0:
            raise ValueError("warmup_rounds, max_staleness and explore_peers must be ≥ 0")
        if self.explore_every < 1 or self.head_every < 1:
            raise ValueError("explore_every and head_every must be ≥ 1")


class _PmlNode(TrainedLocally, Algorithm):
    """A node training its personalised model with PML; what it shares is up to subclasses."""

    config_type = MaplConfig

    def __init__(self, setup: NodeSetup, config: MaplConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or MaplConfig()
        data = setup.data
        self.data = data
        self.spec = ModelSpec(
            backbone=setup.backbone,
            image_shape=tuple(data.train_images.shape[1:]),
            num_classes=data.num_classes,
            latent_dim=config.latent_dim,
            projection_dim=config.projection_dim,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(setup.seed)
            self.model = make_model(self.spec)
            if config.shared_head_init:
                # Head similarity is only comparable between heads that started from one point.
                torch.manual_seed(setup.shared_seed)
                self.model.head.reset_parameters()
            self.initial_head = to_numpy(self.model.head.weight)
        self.generator = seeded_generator(setup.seed, 1)
        self.augment = default_augment(self.spec.image_shape)
        self.trainer = LocalTrainer(self.model, data.train_images, data.train_labels, config.training, self.generator)
        self.class_counts = tuple(int(c) for c in data.class_counts)

    def _pml_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        first, second = two_views(images, self.augment, self.generator)
        out = self.model(torch.cat([first, second]))
        both = labels.repeat(2)
        parts = {
            "supcon": supervised_contrastive(out.projection, both, cfg.supcon_temperature),
            "cross_entropy": F.cross_entropy(out.logits, both),
            "prototype": prototype_alignment(out.projection, both, self.model.prototypes, cfg.prototype_temperature),
            "uniformity": prototype_uniformity(self.model.prototypes, cfg.uniformity_temperature),
        }
        loss = (
            cfg.weight_supcon * parts["supcon"]
            + cfg.weight_cross_entropy * parts["cross_entropy"]
            + cfg.weight_prototype * parts["prototype"]
            + cfg.weight_uniformity * parts["uniformity"]
        )
        return loss, {name: value.item() for name, value in parts.items()}

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self._pml_loss)


class Local(_PmlNode):
    """No communication at all: the floor every collaborative method must beat."""

    name = "local"


class Oracle(_PmlNode):
    """Trains on the pooled training data of its true cluster (the driver hands that in as the
    node's shard). No P2P method can do this; reports use it as the ceiling."""

    name = "oracle"


class Mapl(_PmlNode):
    name = "mapl"
    learn_graph = True
    share_backbone = False

    def __init__(self, setup: NodeSetup, config: MaplConfig | None = None) -> None:
        super().__init__(setup, config)
        self.view = NeighbourView(self.config.max_staleness)
        self.graph = GraphOptimizer(self.config.graph)
        self.w: dict[str, float] = {self.node_id: 1.0}
        self.graph_learned = False
        self.explore_rng = np.random.default_rng([setup.seed, 2])

    # -- peers and weights ------------------------------------------------------------------

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.view.set_peers(self.peers)
        if not self.graph_learned:
            # Before the graph is learned everyone is a neighbour, uniformly (self included).
            uniform = 1.0 / (len(self.peers) + 1)
            self.w = dict.fromkeys((self.node_id, *self.peers), uniform)
        else:
            self.w = {node: weight for node, weight in self.w.items() if node == self.node_id or node in self.peers}

    def weights(self) -> dict[str, float]:
        total = sum(self.w.values())
        return {node: weight / total for node, weight in self.w.items()}

    def neighbours(self) -> tuple[str, ...]:
        return tuple(node for node, weight in self.w.items() if weight > 0 and node != self.node_id)

    def _graph_phase(self, round: int) -> bool:
        return self.learn_graph and round >= self.config.warmup_rounds

    def expected(self, round: int) -> tuple[str, ...]:
        """Everyone at round 0; afterwards the neighbours that sent last round. A peer sends only
        if it gives us weight, which we cannot see, and a peer that stopped (finished, died, or
        cut us) should cost one wait, not one per round."""
        if round == 0:
            return self.peers
        neighbours = set(self.neighbours())
        return tuple(p for p in self.view.senders_since(MessageType.PROTOTYPES, round - 1) if p in neighbours)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "w": dict(self.w),
            "graph_learned": self.graph_learned,
            "graph_moments": [dict(self.graph.first_moment), dict(self.graph.second_moment)],
            "graph_step_count": self.graph.step_count,
            "explore_rng": self.explore_rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.w = {str(k): float(v) for k, v in state["w"].items()}
            self.graph_learned = bool(state["graph_learned"])
            first, second = state["graph_moments"]
            self.graph.first_moment, self.graph.second_moment = dict(first), dict(second)
            self.graph.step_count = int(state["graph_step_count"])
            self.explore_rng.bit_generator.state = state["explore_rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the saved graph state does not fit: {exc}") from None

    # -- publish and receive ----------------------------------------------------------------

    def _targets(self, round: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(neighbours, explored non-neighbours) this round's payloads go to."""
        if not self._graph_phase(round):
            return self.peers, ()
        neighbours = self.neighbours()
        cfg = self.config
        outsiders = sorted(set(self.peers) - set(neighbours))
        if not (cfg.explore_peers and outsiders and (round - cfg.warmup_rounds) % cfg.explore_every == 0):
            return neighbours, ()
        # Without this a zero weight is final: a peer we no longer hear from is never re-scored.
        chosen = self.explore_rng.choice(len(outsiders), size=min(cfg.explore_peers, len(outsiders)), replace=False)
        return neighbours, tuple(sorted(outsiders[i] for i in chosen))

    def publish(self, round: int) -> list[Outbound]:
        neighbours, explored = self._targets(round)
        graph_phase = self._graph_phase(round)
        head_round = graph_phase and (round - self.config.warmup_rounds) % self.config.head_every == 0

        def prototypes(with_head: bool) -> Prototypes:
            return Prototypes(
                classes=tuple(range(self.spec.num_classes)),
                counts=self.class_counts,
                prototypes=to_numpy(self.model.prototypes),
                head=to_numpy(self.model.head.weight) if with_head else None,
            )

        # An explored peer always gets the head: without it, it cannot score us.
        with_head = (*neighbours, *explored) if head_round else explored
        without_head = () if head_round else neighbours
        out = [
            Outbound(to=tuple(sorted(to)), body=prototypes(head))
            for to, head in ((with_head, True), (without_head, False))
            if to
        ]
        if self.share_backbone and (neighbours or explored):
            out.append(
                Outbound(
                    to=tuple(sorted((*neighbours, *explored))),
                    body=Model(kind="params", tensors={k: to_numpy(v) for k, v in self._shared().items()}),
                )
            )
        return out

    def _shared(self) -> dict[str, torch.Tensor]:
        return shared_state({"backbone": self.model.backbone, "projector": self.model.projector})

    def receive(self, peer: str, round: int, body: Body, frame: Frame | None = None) -> None:
        if isinstance(body, Prototypes):
            check_prototypes(body, self.spec.num_classes, self.spec.projection_dim, all_classes=True)
            if body.head is not None and self.learn_graph:
                head = Head(weight=body.head, bias=None)
                check_head(head, self.model.head, with_bias=False)
                # Kept apart from the prototypes: a later head-less message must not hide it.
                self.view.put(peer, round, head)
        elif isinstance(body, Model) and self.share_backbone:
            check_model(body, self._shared())
        else:
            raise PayloadRejected("unexpected_type", f"{self.name} takes no {body.TYPE.value} payloads")
        self.view.put(peer, round, body)

    # -- graph step and aggregation ---------------------------------------------------------

    def end_round(self, round: int) -> None:
        if self._graph_phase(round):
            self._graph_step(round)
        prototypes = self.view.fresh(MessageType.PROTOTYPES, round)
        self._count_missing(prototypes)
        mix = self._mixing(prototypes)
        with torch.no_grad():
            own = self.model.prototypes
            mixed = own * mix.pop(self.node_id)
            for peer, weight in mix.items():
                mixed += weight * torch.tensor(prototypes[peer].prototypes)
            own.copy_(mixed)
        if self.share_backbone:
            models = self.view.fresh(MessageType.MODEL, round)
            mix = self._mixing(models)
            own_weight = mix.pop(self.node_id)
            average_states(self._shared(), own_weight, [(w, models[p].tensors) for p, w in mix.items()])

    def _mixing(self, payloads: dict[str, Body]) -> dict[str, float]:
        """Weights over self and the neighbours whose payload arrived, renormalised to sum 1."""
        mix = {self.node_id: self.w.get(self.node_id, 0.0)}
        mix.update({peer: self.w[peer] for peer in payloads if self.w.get(peer, 0.0) > 0})
        total = sum(mix.values())
        if total <= 0:
            return {self.node_id: 1.0}
        return {node: weight / total for node, weight in mix.items()}

    def _count_missing(self, arrived: dict[str, Body]) -> None:
        for peer in self.neighbours():
            if peer not in arrived:
                self.missing[peer] = self.missing.get(peer, 0) + 1

    def _graph_step(self, round: int) -> None:
        cfg = self.config
        heads = self.view.fresh(MessageType.HEAD, round, cfg.head_every - 1 + cfg.max_staleness)
        if not heads and self.graph_learned:
            # No evidence this round (e.g. the node was down or jumped ahead): keep the graph
            # rather than fall back to talking to no one, which nobody could undo.
            return
        candidates = [self.node_id, *sorted(heads)]
        own_head = to_numpy(self.model.head.weight)
        measure = cfg.graph.similarity
        similarity = np.array(
            [1.0] + [head_similarity(own_head, heads[p].weight, measure, self.initial_head) for p in candidates[1:]]
        )
        sizes = self._dataset_sizes(candidates)
        confidence = sizes / sizes.sum()
        start = np.array([self.w.get(node, 0.0) for node in candidates])
        if start.sum() <= 0:
            start = np.full(len(candidates), 1.0 / len(candidates))
        new = self.graph.step(candidates, start, similarity, confidence, 0)
        self.w = dict(zip(candidates, new.tolist()))
        self.graph_learned = True

    def _dataset_sizes(self, candidates: list[str]) -> np.ndarray:
        """n_j as each peer advertises it (the counts in its prototypes); own size for itself."""
        own = float(sum(self.class_counts))
        advertised = self.view.latest(MessageType.PROTOTYPES)
        return np.array(
            [
                own if node == self.node_id or node not in advertised else float(max(1, sum(advertised[node].counts)))
                for node in candidates
            ]
        )


class MaplNoCgl(Mapl):
    """MAPL with the graph fixed at all-to-all uniform: prototype averaging, no graph learning."""

    name = "mapl-nocgl"
    learn_graph = False


class MaplPlus(Mapl):
    """MAPL+ for one backbone everywhere: backbone and projector are averaged with the learned w."""

    name = "mapl+"
    homogeneous = True
    share_backbone = True
