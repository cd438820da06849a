"""SFMTL-Graph (Saleh et al.), without its server: feature anchors, head-response similarity,
Louvain communities, and within-community aggregation, computed by every node for itself.

Each node has a backbone θ and a linear head φ (weight and bias), all nodes starting from one
common initialisation so that heads and features compare. A round:

1. **Local step**: cross-entropy + λ · MSE(θ(x_i), h^(c_i)), where h^(c) is the node's anchor of
   class c from the last round (paper (5)-(6)); no anchor term for a class without one yet.
2. **Publish to every peer**: the anchors (per-class mean backbone features of the node's
   training data, in eval mode, after the local step) with their sample counts in `PROTOTYPES`,
   and the head in `HEAD`.
3. **End of round**: from its own and its peers' fresh payloads a node computes the similarity
   a_kl of *every* pair (paper (7)-(10)):

       a_kl = max(0, α · Sim_head(k, l) + (1 − α) · Sim_repr(k, l))
       Sim_head = mean over shared classes c of ½ Σ_{h ∈ {h_k^c, h_l^c}} cos(φ_k(h), φ_l(h))
       Sim_repr = mean over shared classes c of cos(h_k^c, h_l^c)        (no shared class: a_kl = 0)

   runs Louvain on that graph (paper (11)-(13), `graph.communities`), and keeps its own
   community C. Its anchors become the community's, per class weighted by each member's count
   of that class (14); its head is pulled towards the members' heads (15):
   φ ← φ − λτ Σ_{l ∈ C} a_kl (φ − φ_l).

Where and why this deviates from the paper:
- **No server.** Each node builds the graph from what its peers sent. With every payload in
  (the simulator, a healthy testnet) every node sees the same graph and, since the Louvain seed
  is the network's shared seed and nodes are ordered by id, finds the same communities the
  server would. A node that missed a payload decides on what it has.
- **All-to-all traffic.** Communities are recomputed every round from everyone's payloads, so
  every peer's payload matters whatever the last partition was; each node sends to and expects
  all its peers (a peer that stopped sending is expected once more, not every round).
- **Anchors are aggregated per class**, each member weighted by its count of that class, not by
  its total sample count: a member without the class cannot contribute an anchor for it.
- **The pull stays a convex combination**: if λτ Σ a_kl exceeds 1 the coefficients are scaled
  down to sum to 1, so a large community cannot overshoot the heads it pulls towards.
- **The head travels with its bias** in its own `HEAD` frame: the head's response φ(h) = Wh + b
  needs it, and (15) pulls it along with the weight.
- **Round 0 has no anchor term** (the paper draws h^(0) ~ N(0, I)); the MSE is averaged over
  the feature dimension as well (λ absorbs the scale).
- **BatchNorm statistics are recomputed on the shard** before the anchors are taken
  (statistics.refresh_statistics): with the lagging moving averages, anchors and features fed each
  other and grew without bound (measured: `_class_means`).
- **Augmented local steps** (`augment`, on by default): one random affine view per batch, as
  MAPL's PML. On mnist5k (10 nodes, 10 samples per class, 80 rounds) accuracy was 0.884 without
  it and 0.933 with it, level with `local` (0.932), which augments too (docs/learning.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from protocol.messages import Body, Head, MessageType, Prototypes

from ..data.augment import augment, default_augment
from ..graphs.graph import communities
from ..interface import Algorithm, LocalReport, NeighbourView, NodeSetup, Outbound, PayloadRejected
from ..models.statistics import refresh_statistics
from ..models.training import LocalTrainer, TrainedLocally, TrainingConfig, node_model
from ..outliers import OutlierConfig, Scale, ScaleGuard, row_scale, state_scale
from ..payloads import check_head, check_prototypes, to_numpy

__all__ = [
    "SfmtlConfig",
    "TaskSummary",
    "cosine",
    "head_response_similarity",
    "representation_similarity",
    "task_similarity",
    "similarity_matrix",
    "aggregate_anchors",
    "anchor_weights",
    "pull_coefficients",
    "Sfmtl",
]


@dataclass(frozen=True)
class SfmtlConfig:
    training: TrainingConfig = field(default_factory=TrainingConfig)
    latent_dim: int = 128
    anchor_weight: float = 1.0  # λ of the anchor loss (6)
    alpha: float = 0.5  # α of (7): head-response against representation similarity (paper: 0.49)
    head_pull: float = 0.25  # λτ of (15) (paper: τ = η·R = 0.05 · 5)
    louvain_resolution: float = 1.0  # modularity resolution; > 1 gives smaller communities
    max_staleness: int = 1  # rounds a peer's payload stays usable
    # Train on one randomly shifted, rotated and zoomed view of each batch (MAPL's augmentation);
    # false: the raw images, as the paper.
    augment: bool = True
    outliers: OutlierConfig = field(default_factory=OutlierConfig)  # anchors, heads off the neighbourhood's scale

    def __post_init__(self) -> None:
        if self.latent_dim < 1:
            raise ValueError(f"latent_dim must be ≥ 1, got {self.latent_dim}")
        if not (math.isfinite(self.anchor_weight) and self.anchor_weight >= 0):
            raise ValueError(f"anchor_weight must be a finite number ≥ 0, got {self.anchor_weight}")
        for name in ("alpha", "head_pull"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not (math.isfinite(self.louvain_resolution) and self.louvain_resolution > 0):
            raise ValueError(f"louvain_resolution must be a finite number > 0, got {self.louvain_resolution}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be ≥ 0, got {self.max_staleness}")


# -- the server's arithmetic, as pure functions ------------------------------------------------


@dataclass(frozen=True)
class TaskSummary:
    """What a node publishes about its task in a round: an anchor and a sample count per own
    class, and its linear head (logits = weight @ h + bias)."""

    anchors: Mapping[int, np.ndarray]
    counts: Mapping[int, int]
    weight: np.ndarray
    bias: np.ndarray

    @classmethod
    def of(cls, prototypes: Prototypes, head: Head) -> TaskSummary:
        assert head.bias is not None  # check_head requires it: our heads have a bias
        return cls(
            anchors=dict(zip(prototypes.classes, prototypes.prototypes, strict=True)),
            counts=dict(zip(prototypes.classes, prototypes.counts, strict=True)),
            weight=head.weight,
            bias=head.bias,
        )

    def response(self, anchor: np.ndarray) -> np.ndarray:
        """The head's logits on a feature vector: φ(h)."""
        return self.weight.astype(np.float64) @ anchor.astype(np.float64) + self.bias.astype(np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """SimCos (9); a zero vector has no direction and counts as 0."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms > 0 else 0.0


def shared_classes(first: TaskSummary, second: TaskSummary) -> list[int]:
    return sorted(set(first.anchors) & set(second.anchors))


def head_response_similarity(first: TaskSummary, second: TaskSummary) -> float:
    """Sim_head (8): how alike the two heads answer both nodes' anchors of each shared class."""
    per_class = [
        np.mean([cosine(first.response(h), second.response(h)) for h in (first.anchors[c], second.anchors[c])])
        for c in shared_classes(first, second)
    ]
    return float(np.mean(per_class)) if per_class else 0.0


def representation_similarity(first: TaskSummary, second: TaskSummary) -> float:
    """Sim_repr (10): cosine of the two nodes' anchors of each shared class, averaged."""
    per_class = [cosine(first.anchors[c], second.anchors[c]) for c in shared_classes(first, second)]
    return float(np.mean(per_class)) if per_class else 0.0


def task_similarity(first: TaskSummary, second: TaskSummary, alpha: float) -> float:
    """a_kl (7), clipped at 0; 0 for nodes without a shared class (nothing to compare)."""
    if not shared_classes(first, second):
        return 0.0
    head = head_response_similarity(first, second)
    return max(0.0, alpha * head + (1 - alpha) * representation_similarity(first, second))


def similarity_matrix(tasks: Sequence[TaskSummary], alpha: float) -> np.ndarray:
    """The symmetric graph of every pair's a_kl, zero on the diagonal."""
    a = np.zeros((len(tasks), len(tasks)))
    for i in range(len(tasks)):
        for j in range(i + 1, len(tasks)):
            a[i, j] = a[j, i] = task_similarity(tasks[i], tasks[j], alpha)
    return a


def aggregate_anchors(members: Sequence[TaskSummary], classes: Sequence[int]) -> dict[int, np.ndarray]:
    """The community's anchor of each of `classes` (14): the members' anchors of that class,
    weighted by their counts of it. A class no member has is left out."""
    aggregated = {}
    for c in classes:
        holders = [(m.counts[c], m.anchors[c].astype(np.float64)) for m in members if c in m.anchors]
        total = sum(count for count, _ in holders)
        if total > 0:
            aggregated[c] = sum(count * anchor for count, anchor in holders) / total
    return aggregated


def anchor_weights(members: Mapping[str, TaskSummary], classes: Sequence[int]) -> dict[str, float]:
    """Each member's share of the samples behind the aggregated anchors of `classes` (the node's
    own): the row of W these anchors amount to. Sums to 1 if any member has one of the classes."""
    samples = {name: sum(m.counts.get(c, 0) for c in classes) for name, m in members.items()}
    total = sum(samples.values())
    return {name: count / total for name, count in samples.items()} if total > 0 else {}


def pull_coefficients(similarities: Mapping[str, float], head_pull: float) -> dict[str, float]:
    """The coefficient of each member's head in (15), φ ← (1 − Σ c_l) φ + Σ c_l φ_l with
    c_l = λτ a_kl, scaled down if needed so that Σ c_l ≤ 1 (a convex combination)."""
    raw = {name: head_pull * a for name, a in similarities.items()}
    scale = max(1.0, sum(raw.values()))
    return {name: value / scale for name, value in raw.items()}


# -- one node -----------------------------------------------------------------------------------


class Sfmtl(TrainedLocally, Algorithm):
    """One node of SFMTL-Graph; see the module docstring."""

    name = "sfmtl"
    homogeneous = True  # features and heads compare only between identical architectures
    config_type = SfmtlConfig
    sends = frozenset({MessageType.PROTOTYPES, MessageType.HEAD})
    waits_for = sends  # the graph needs both of a peer's payloads
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.PROTOTYPES: "anchors", MessageType.HEAD: "head"}

    def __init__(self, setup: NodeSetup, config: SfmtlConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or SfmtlConfig()
        self.data = setup.data
        # One initial model for everyone: anchors and heads of different nodes live in one space.
        self.spec, self.model = node_model(setup, setup.shared_seed, latent_dim=config.latent_dim)
        self.trainer = LocalTrainer.for_node(self.model, setup, config.training)
        self.view = NeighbourView(config.max_staleness)
        self.guard = ScaleGuard(config.outliers, config.max_staleness)
        self.augment = default_augment(self.spec.image_shape) if config.augment else None
        self.own_classes = self.data.own_classes
        self.anchors: dict[int, torch.Tensor] = {}  # targets of the anchor loss: the community's
        self.row: dict[str, float] = {self.node_id: 1.0}
        self.community: tuple[str, ...] = (self.node_id,)
        # This round's payloads and what they say, computed once: peers get what the node uses.
        self._published: tuple[int, TaskSummary, tuple[Prototypes, Head]] | None = None

    # -- local step --------------------------------------------------------------------------

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        if self.augment is not None:
            # Drawn from the trainer's generator: one stream per node for batches and views.
            images = augment(images, self.augment, self.trainer.generator)
        features = self.model.latent(images)
        cross_entropy = F.cross_entropy(self.model.head(features), labels)
        known = [i for i, label in enumerate(labels.tolist()) if label in self.anchors]
        if known:
            targets = torch.stack([self.anchors[int(labels[i])] for i in known])
            anchor = F.mse_loss(features[known], targets)
        else:
            anchor = features.sum() * 0.0
        loss = cross_entropy + self.config.anchor_weight * anchor
        return loss, {"cross_entropy": cross_entropy.item(), "anchor": anchor.item()}

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self._loss)

    @torch.no_grad()
    def _class_means(self, batch_size: int = 512) -> np.ndarray:
        """Mean backbone features of each own class over the training shard, in eval mode, with
        BatchNorm statistics of the shard itself (statistics.refresh_statistics)."""
        images, labels = self.data.train_images, self.data.train_labels
        # Eval-mode features are the anchors, and the anchor loss pulls train-mode features to them.
        # Running statistics lag the training (the variance grows round after round), which makes
        # eval-mode features systematically larger; pulled towards them, features grow further: on
        # mnist5k the anchors' norm doubled every three rounds after round 30 and accuracy fell from
        # 0.92 to 0.5. Statistics of the whole shard itself break that loop.
        refresh_statistics(self.model.backbone, self.model.backbone, images, batch_size, limit=None)
        chunks = list(images.split(batch_size))
        was_training = self.model.training
        self.model.eval()
        features = torch.cat([self.model.latent(chunk) for chunk in chunks])
        self.model.train(was_training)
        return to_numpy(torch.stack([features[labels == c].mean(0) for c in self.own_classes]))

    def own_payloads(self, round: int) -> tuple[TaskSummary, tuple[Prototypes, Head]]:
        """This round's anchors and head, as bodies and as the summary the graph step reads."""
        if self._published is None or self._published[0] != round:
            counts = self.data.class_counts
            prototypes = Prototypes(
                classes=self.own_classes,
                counts=tuple(int(counts[c]) for c in self.own_classes),
                prototypes=self._class_means(),
            )
            head = Head(weight=to_numpy(self.model.head.weight), bias=to_numpy(self.model.head.bias))
            self._published = (round, TaskSummary.of(prototypes, head), (prototypes, head))
        return self._published[1], self._published[2]

    # -- peers, publish and receive ---------------------------------------------------------

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.view.set_peers(self.peers)
        self.guard.set_peers(self.peers)

    def expected(self, round: int) -> tuple[str, ...]:
        """Every peer at round 0; afterwards every peer that sent last round. All of them, not
        the last community: the next partition is computed from everyone's payloads."""
        return self.peers if round == 0 else self.view.senders_since(MessageType.PROTOTYPES, round - 1)

    def publish(self, round: int) -> list[Outbound]:
        _, bodies = self.own_payloads(round)
        return [Outbound(to=self.peers, body=body) for body in bodies] if self.peers else []

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        """Anchors must be one row of the latent width per known class, each from ≥ 1 sample;
        a head must have our head's shape, bias included. A head riding on PROTOTYPES is not
        used: the HEAD frame carries it with its bias."""
        # Against what this node published last (computing this round's here would take it
        # before the local step): scales move little from one round to the next.
        own = None if self._published is None else self._published[1]
        if isinstance(body, Prototypes):
            check_prototypes(body, self.spec.num_classes, self.spec.latent_dim, all_classes=False)
            if any(count < 1 for count in body.counts):
                raise PayloadRejected("bad_count", f"an anchor from {min(body.counts)} samples")
            own_scale = 0.0 if own is None else row_scale(np.stack(list(own.anchors.values())))
            return {"anchors": Scale(row_scale(body.prototypes), own_scale)}
        assert isinstance(body, Head)
        check_head(body, self.model.head, with_bias=True)
        own_scale = 0.0 if own is None else state_scale([own.weight, own.bias])
        return {"head": Scale(state_scale([body.weight, body.bias]), own_scale)}

    # -- graph step and aggregation ---------------------------------------------------------

    def fresh_tasks(self, round: int) -> dict[str, TaskSummary]:
        """Itself and every peer whose anchors and head are both fresh, by node id."""
        prototypes = self.view.fresh(MessageType.PROTOTYPES, round)
        heads = self.view.fresh(MessageType.HEAD, round)
        tasks = {peer: TaskSummary.of(prototypes[peer], heads[peer]) for peer in prototypes.keys() & heads.keys()}
        return {**tasks, self.node_id: self.own_payloads(round)[0]}

    def end_round(self, round: int) -> None:
        tasks = self.fresh_tasks(round)
        # Sorted ids and the shared seed: every node holding the same payloads finds the same partition.
        ids = sorted(tasks)
        similarity = similarity_matrix([tasks[i] for i in ids], self.config.alpha)
        labels = communities(similarity, seed=self.setup.shared_seed, resolution=self.config.louvain_resolution)
        me = ids.index(self.node_id)
        self.community = tuple(ids[j] for j in range(len(ids)) if labels[j] == labels[me])
        members = {name: tasks[name] for name in self.community}
        self.row = anchor_weights(members, self.own_classes)
        anchors = aggregate_anchors(list(members.values()), self.own_classes)
        device = self.setup.device
        self.anchors = {c: torch.tensor(anchor.astype(np.float32), device=device) for c, anchor in anchors.items()}
        peers = {name: similarity[me, ids.index(name)] for name in self.community if name != self.node_id}
        self._pull_head(pull_coefficients(peers, self.config.head_pull), members)

    @torch.no_grad()
    def _pull_head(self, coefficients: Mapping[str, float], members: Mapping[str, TaskSummary]) -> None:
        head = self.model.head
        keep = 1.0 - sum(coefficients.values())
        weight, bias = head.weight * keep, head.bias * keep
        for name, c in coefficients.items():  # copies (wire arrays are read-only), where our head is
            weight += c * torch.tensor(members[name].weight, device=weight.device)
            bias += c * torch.tensor(members[name].bias, device=bias.device)
        head.weight.copy_(weight)
        head.bias.copy_(bias)

    def weights(self) -> dict[str, float]:
        return dict(self.row)

    # -- checkpoint --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "anchors": dict(self.anchors),
            "row": dict(self.row),
            "community": list(self.community),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            device = self.setup.device
            anchors = {
                int(c): torch.as_tensor(a, dtype=torch.float32, device=device) for c, a in state["anchors"].items()
            }
            row = {str(name): float(w) for name, w in state["row"].items()}
            community = tuple(str(name) for name in state["community"])
        except (KeyError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"the saved SFMTL state is incomplete: {exc}") from None
        if any(a.shape != (self.spec.latent_dim,) or c not in self.own_classes for c, a in anchors.items()):
            raise ValueError(f"the saved anchors do not fit this node (classes {self.own_classes})")
        self.anchors, self.row, self.community = anchors, row, community
