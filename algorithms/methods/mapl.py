"""MAPL (Mukherjee, Simonetto & Jamali-Rad): personalised models on heterogeneous backbones,
plus a learned collaboration graph. Also its no-communication relatives, Local and Oracle.

Per round: a PML local step (supervised contrastive + cross-entropy + sample-to-prototype +
prototype uniformity, on two augmented views), then prototypes go to the current neighbours;
after warm-up the classifier head rides along every `head_every` rounds (in the same PROTOTYPES
frame) and CGL updates the weight vector from head similarity. Prototypes are aggregated with
those weights every round, warm-up included: ξ_i ← w_ii ξ_i + Σ_j w_ij ξ_j.

The variants are compositions: MAPL is a PML node with a learned neighbourhood
(collaboration.LearnedGraph); MAPL without CGL swaps in the uniform one; MAPL+ (one backbone
everywhere) adds shared modules (payloads.SharedModules), its backbone and projector, mixed with
the learned weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from protocol.messages import Body, Head, MessageType, Model, Prototypes

from ..copies import Authors
from ..data.augment import default_augment, two_views
from ..graphs.collaboration import InNeighbourhood, LearnedGraph, UniformGraph
from ..graphs.graph import GraphConfig, head_similarity, row_cosines
from ..interface import Algorithm, Frame, LocalReport, NeighbourView, NodeSetup, Outbound, PayloadRejected
from ..models.losses import prototype_alignment, prototype_uniformity, supervised_contrastive
from ..models.personal import ModelOutput
from ..models.training import LocalTrainer, TrainedLocally, TrainingConfig, node_model
from ..outliers import OutlierConfig, Scale, ScaleGuard, norm, row_scale
from ..payloads import SharedModules, check_head, check_prototypes, to_numpy

__all__ = ["MaplConfig", "PmlNode", "Mapl", "MaplNoCgl", "MaplPlus", "Local", "Oracle", "PROTOTYPES_DISAGREE"]

PROTOTYPES_DISAGREE = "prototypes_disagree"  # a peer's prototypes point elsewhere than ours (MaplConfig)


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
    # Every node starts from the same head (seeded by the network), and where it shares them the
    # same prototypes: heads and prototypes then compare from the first round (their similarity,
    # their scale and direction: `prototype_ratio`, `prototype_agreement`).
    shared_head_init: bool = True
    # A peer's prototypes, head (or model) far off the scale of ours and our neighbours' is
    # refused (`out_of_scale`): a poisoning peer's scaled payload, which head similarity cannot see.
    outliers: OutlierConfig = field(default_factory=OutlierConfig)
    # Prototypes start alike (`shared_head_init`), are unit vectors trained through cosines and
    # are mixed as such, so their scale and their direction on the classes two nodes both hold
    # are fixed by design: honest ones stayed within 0.995-1.005 of the node's scale and at a
    # mean cosine ≥ 0.98 (mnist5k, 10 nodes, 80 rounds: MAPL-Dual with four backbones in
    # Scenario 2, MAPL+ in Scenario 1, seed 1; digits, 8 rounds: ≥ 0.997). A peer's prototypes
    # off the scale by this factor are refused (`out_of_scale`): ×3, within
    # `outliers.max_norm_ratio`, drew a poisoner a cluster-mate's weight (issue #43) ...
    prototype_ratio: float = 1.5
    # ... or whose mean cosine to this node's own, over the classes both hold, is below this
    # (`prototypes_disagree`): sign-flipped, random and class-rotated prototypes scored -0.6 to
    # 0.72 (digits, 8 rounds), and the node fell back on itself instead (OutlierConfig's rules:
    # the peer is distrusted until its prototypes pass again). -1: no check.
    prototype_agreement: float = 0.8

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
        if not (self.prototype_ratio > 1 and -1 <= self.prototype_agreement <= 1):
            raise ValueError("prototype_ratio must be > 1 (inf: no bound) and prototype_agreement in [-1, 1]")


class PmlNode(TrainedLocally, Algorithm):
    """A node training its personalised model with PML; it shares nothing (subclasses do)."""

    config_type = MaplConfig
    shares_prototypes: ClassVar[bool] = False  # so they start alike on every node (shared_head_init)
    # Whether the whole model starts from the network's shared seed (one start on every node of a
    # backbone), as models that are averaged must: MAPL-Auto's. Averaging two models started
    # apart mixes unrelated features.
    shared_start: ClassVar[bool] = False

    def __init__(self, setup: NodeSetup, config: MaplConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or MaplConfig()
        self.data = setup.data
        # Head similarity is only comparable between heads that started from one point.
        self.spec, self.model = node_model(
            setup,
            setup.shared_seed + 2 if self.shared_start else setup.seed,
            latent_dim=config.latent_dim,
            projection_dim=config.projection_dim,
            head_seed=setup.shared_seed if config.shared_head_init else None,
            prototypes_seed=setup.shared_seed + 1 if config.shared_head_init and self.shares_prototypes else None,
        )
        self.initial_head = to_numpy(self.model.head.weight)
        self.trainer = LocalTrainer.for_node(self.model, setup, config.training)
        self.augment = default_augment(self.spec.image_shape)
        self.class_counts = tuple(int(c) for c in self.data.class_counts)

    def _views(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two augmented views of the batch, stacked, and their labels. The views are drawn from
        the trainer's generator: one stream per node for batches and views."""
        first, second = two_views(images, self.augment, self.trainer.generator)
        return torch.cat([first, second]), labels.repeat(2)

    def _pml_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        views, both = self._views(images, labels)
        loss, parts = self._pml_terms(self.model(views), both)
        return loss, {name: value.item() for name, value in parts.items()}

    def _pml_terms(self, out: ModelOutput, both: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """PML's four terms on the model's output for two views, and their weighted sum."""
        cfg = self.config
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
        return loss, parts

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self._pml_loss)


class Local(PmlNode):
    """No communication at all: the floor every collaborative method must beat."""

    name = "local"


class Oracle(PmlNode):
    """Trains on the pooled training data of its true cluster (the driver hands that in as the
    node's shard). No P2P method can do this; reports use it as the ceiling."""

    name = "oracle"


class Mapl(InNeighbourhood, PmlNode):
    """PML + prototypes (and, in graph rounds, heads) to the neighbours + a learned graph."""

    name = "mapl"
    sends = frozenset({MessageType.PROTOTYPES})
    shares_prototypes = True
    # A refused head riding on the prototypes distrusts the peer for them too.
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.PROTOTYPES: "prototypes"}
    heard_by = MessageType.PROTOTYPES

    def __init__(self, setup: NodeSetup, config: MaplConfig | None = None) -> None:
        super().__init__(setup, config)
        self.view = NeighbourView(self.config.max_staleness)
        self.graph = self._neighbourhood()
        # A neighbour's head is a reference as long as it is usable; its prototypes come every round.
        self.guard = ScaleGuard(self.config.outliers, self.config.head_every - 1 + self.config.max_staleness)
        # Whether this node's prototypes started as every node's (`shared_head_init`) or have
        # been mixed with a neighbour's since: before that they are a random start of its own,
        # and no other node's need agree with them in scale or direction.
        self.prototypes_mixed = self.config.shared_head_init
        self.authors = Authors()  # who sent which prototypes first: a copy is refused

    def _neighbourhood(self) -> UniformGraph:
        cfg = self.config
        return LearnedGraph(
            self.node_id,
            cfg.graph,
            warmup_rounds=cfg.warmup_rounds,
            explore_every=cfg.explore_every,
            explore_peers=cfg.explore_peers,
            seed=self.setup.seed,
        )

    # -- publish and receive ----------------------------------------------------------------

    def publish(self, round: int) -> list[Outbound]:
        neighbours, explored = self.graph.targets(round)
        warmup, every = self.config.warmup_rounds, self.config.head_every
        head_round = self.graph.learning(round) and (round - warmup) % every == 0
        # An explored peer always gets the head: without it, it cannot score us.
        with_head = (*neighbours, *explored) if head_round else explored
        without_head = () if head_round else neighbours
        return [
            Outbound(to=tuple(sorted(to)), body=self._prototypes(head))
            for to, head in ((with_head, True), (without_head, False))
            if to
        ]

    def _prototypes(self, with_head: bool) -> Prototypes:
        prototypes = to_numpy(self.model.prototypes)
        self.authors.authored(self.node_id, prototypes)  # echoed back by a peer, it is refused
        return Prototypes(
            classes=tuple(range(self.spec.num_classes)),
            counts=self.class_counts,
            prototypes=prototypes,
            head=to_numpy(self.model.head.weight) if with_head else None,
        )

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        assert isinstance(body, Prototypes)
        check_prototypes(body, self.spec.num_classes, self.spec.projection_dim, all_classes=True)
        if body.head is not None:
            check_head(Head(weight=body.head, bias=None), self.model.head, with_bias=False)
        # Shapes first, then authorship, direction and scale: a payload of the wrong form is
        # refused as such.
        if peer in self.peers:  # another's is refused as such when kept
            self.authors.check(peer, body.prototypes)
        own = to_numpy(self.model.prototypes)
        self._check_agreement(body, own)
        ratio = self.config.prototype_ratio if self.config.shared_head_init else None
        scales = {"prototypes": Scale(row_scale(body.prototypes), row_scale(own), ratio=ratio)}
        if body.head is not None:
            scales["head"] = Scale(norm(body.head), norm(to_numpy(self.model.head.weight)))
        return scales

    def _check_agreement(self, body: Prototypes, own: np.ndarray) -> None:
        """Refuse prototypes that point elsewhere than this node's own on the classes both hold
        (`prototype_agreement`), from the start where every node's started alike, otherwise once
        this node has mixed its neighbours' (before that, its own are a random start). A peer
        that holds none of its classes is not judged here: its prototypes of those classes
        follow no data (before the common start, a stranger's drifted to a mean cosine of 0.28
        by round 60)."""
        both = zip(self.class_counts, body.counts, strict=True)
        shared = [c for c, (mine, theirs) in enumerate(both) if mine and theirs]
        if not (self.prototypes_mixed and shared) or self.config.prototype_agreement <= -1:
            return
        agreement = float(np.mean(row_cosines(body.prototypes[shared], own[shared])))
        if agreement < self.config.prototype_agreement:
            raise PayloadRejected(
                PROTOTYPES_DISAGREE,
                f"mean cosine {agreement:.3f} to this node's prototypes over the {len(shared)} classes both hold, "
                f"below {self.config.prototype_agreement}",
            )

    def keep(self, peer: str, round: int, body: Body, frame: Frame | None) -> None:
        if isinstance(body, Prototypes) and body.head is not None:
            # Kept apart from the prototypes: a later head-less message must not hide it.
            self.view.put(peer, round, Head(weight=body.head, bias=None))
        self.view.put(peer, round, body)

    # -- graph step and aggregation ---------------------------------------------------------

    def end_round(self, round: int) -> None:
        if self.graph.learning(round):
            similarity = self._similarities(round)
            self.graph.step(similarity, self._dataset_sizes(similarity))
        prototypes, mix = self.mixing(MessageType.PROTOTYPES, round)
        with torch.no_grad():
            own = self.model.prototypes
            mixed = own * mix.pop(self.node_id)
            for peer, weight in mix.items():
                mixed += weight * torch.tensor(prototypes[peer].prototypes, device=own.device)
            own.copy_(mixed)
        self.prototypes_mixed = self.prototypes_mixed or any(weight > 0 for weight in mix.values())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "prototypes_mixed": self.prototypes_mixed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prototypes_mixed = bool(state.get("prototypes_mixed", True))  # older checkpoints: trained, mixed

    def _similarities(self, round: int) -> dict[str, float]:
        """s_ij for each peer whose head is fresh enough: the graph step's evidence."""
        cfg = self.config
        heads = self.view.fresh(MessageType.HEAD, round, cfg.head_every - 1 + cfg.max_staleness)
        own_head = to_numpy(self.model.head.weight)
        return {
            peer: head_similarity(own_head, body.weight, cfg.graph.similarity, self.initial_head)
            for peer, body in heads.items()
        }

    def _dataset_sizes(self, peers) -> dict[str, float]:
        """n_j as each peer advertises it (the counts in its prototypes); own size for itself."""
        own = float(sum(self.class_counts))
        advertised = self.view.latest(MessageType.PROTOTYPES)
        sizes = {peer: float(max(1, sum(advertised[peer].counts))) if peer in advertised else own for peer in peers}
        return {self.node_id: own, **sizes}


class MaplNoCgl(Mapl):
    """MAPL with the graph fixed at all-to-all uniform: prototype averaging, no graph learning."""

    name = "mapl-nocgl"

    def _neighbourhood(self) -> UniformGraph:
        return UniformGraph(self.node_id)


class MaplPlus(Mapl):
    """MAPL+ for one backbone everywhere: backbone and projector are averaged with the learned w."""

    name = "mapl+"
    homogeneous = True
    sends = frozenset({MessageType.PROTOTYPES, MessageType.MODEL})
    judged_parts: ClassVar[Mapping[MessageType, str]] = {**Mapl.judged_parts, MessageType.MODEL: "model"}

    def __init__(self, setup: NodeSetup, config: MaplConfig | None = None) -> None:
        super().__init__(setup, config)
        self.shared = SharedModules({"backbone": self.model.backbone, "projector": self.model.projector})

    def publish(self, round: int) -> list[Outbound]:
        out = super().publish(round)
        recipients = tuple(sorted({peer for each in out for peer in each.to}))
        return [*out, Outbound(to=recipients, body=self.shared.body())] if recipients else out

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        if not isinstance(body, Model):
            return super().inspect(peer, round, body)
        self.shared.check(body)
        return {"model": Scale(self.shared.scale_of(body.tensors), self.shared.scale())}

    def end_round(self, round: int) -> None:
        super().end_round(round)
        self.mix_models(self.shared, round)
