"""FedMRL (Yi et al., "Federated Model Heterogeneous Matryoshka Representation Learning") as a
peer-to-peer algorithm over MAPL's learned graph.

As in the paper, node k holds its own heterogeneous model F_k (feature extractor F_ex, header
F_hd) and a small homogeneous model G (extractor G_ex of width d1, header G_hd), and a personal
linear projector P_k. A sample's two representations are spliced and fused,
R̃ = P_k(G_ex(x) ∘ F_ex(x)) ∈ R^{d2}, and the fused representation feeds two nested
("Matryoshka") heads: the first d1 coordinates go to G_hd (coarse), all d2 to F_hd (fine). The
loss is m_G · CE(G_hd(R̃[:d1])) + m_F · CE(F_hd(R̃)), trained jointly. Prediction uses the fused
representation through F_hd ("mix-large", the paper's default); "mix-small" (through G_hd) is
reported beside it.

Where it deviates from the paper, and why:
- No server. G_ex is averaged over the node's learned neighbourhood, G_i ← Σ_j w_ij G_j, with
  MAPL's CGL (all-to-all uniform during warm-up, then the row learned from head similarity).
- G's header stays on the node, as MAPL-Dual's small head does (algorithms/models/small.py): it is the
  graph's evidence, and averaging it would make a neighbourhood's heads agree because they were
  averaged. In the paper the server averages it too. Its input is the node's personal fused
  representation anyway.
- The paper trains on the raw samples; here a batch is one augmented view (the same
  augmentation every algorithm of this project uses on its few samples), which can be turned off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from protocol.messages import Body, MessageType, Model

from ..data.augment import augment, default_augment
from ..graphs.collaboration import InNeighbourhood, LearnedGraph
from ..graphs.graph import GraphConfig
from ..interface import Algorithm, Evaluation, LocalReport, NeighbourView, NodeSetup, Outbound, Predictors
from ..models.personal import SmallModel, make_backbone
from ..models.small import SmallShare, shared_small_model
from ..models.training import LocalTrainer, TrainedLocally, TrainingConfig, evaluate_predictors
from ..outliers import OutlierConfig, Scale, ScaleGuard
from ..payloads import ENCODINGS

__all__ = ["FedMrlConfig", "FedMrl", "Matryoshka", "MatryoshkaPredictors"]


@dataclass(frozen=True)
class FedMrlConfig:
    training: TrainingConfig = field(default_factory=TrainingConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    latent_dim: int = 128  # d2: the node's own representation, and the fused one
    small_latent_dim: int = 64  # d1 ≤ d2: the shared model's representation
    weight_small: float = 1.0  # m_G
    weight_large: float = 1.0  # m_F
    augment: bool = True
    warmup_rounds: int = 20  # all-to-all uniform graph until then
    max_staleness: int = 1
    explore_every: int = 5
    explore_peers: int = 1
    encoding: str = "float32"  # how G travels: "float32" | "float16"
    # A neighbour's G far off the scale of ours and our neighbours' is refused (algorithms/outliers.py).
    outliers: OutlierConfig = field(default_factory=OutlierConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.small_latent_dim <= self.latent_dim:
            raise ValueError("small_latent_dim must be in [1, latent_dim]: the coarse head reads the first d1 of d2")
        if self.weight_small < 0 or self.weight_large < 0 or self.weight_small + self.weight_large == 0:
            raise ValueError("weight_small and weight_large must be ≥ 0, and not both 0")
        if self.warmup_rounds < 0 or self.max_staleness < 0 or self.explore_peers < 0:
            raise ValueError("warmup_rounds, max_staleness and explore_peers must be ≥ 0")
        if self.explore_every < 1:
            raise ValueError("explore_every must be ≥ 1")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")


class Matryoshka(nn.Module):
    """G and F_k with the projector that fuses their representations, and the two nested heads."""

    def __init__(self, small: SmallModel, backbone: nn.Module, latent_dim: int, num_classes: int) -> None:
        super().__init__()
        self.small = small
        self.backbone = backbone
        self.head = nn.Linear(latent_dim, num_classes)
        self.projector = nn.Linear(small.head.in_features + latent_dim, latent_dim)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(coarse logits through G's header, fine logits through the node's own header)."""
        fused = self.projector(torch.cat([self.small.backbone(images), self.backbone(images)], dim=1))
        return self.small.head(fused[:, : self.small.head.in_features]), self.head(fused)


class MatryoshkaPredictors(Predictors):
    """The fine logits through the node's own header (what FedMRL predicts with), and the
    coarse ones through G's."""

    def __init__(self, model: Matryoshka) -> None:
        super().__init__("mix-large")
        self.model = model

    def all(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        coarse, fine = self.model(images)
        return {"mix-large": fine, "mix-small": coarse}


class FedMrl(InNeighbourhood, TrainedLocally, Algorithm):
    name = "fedmrl"
    config_type = FedMrlConfig
    sends = frozenset({MessageType.MODEL})
    waits_for = frozenset({MessageType.MODEL})
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.MODEL: "model"}
    heard_by = MessageType.MODEL

    def __init__(self, setup: NodeSetup, config: FedMrlConfig | None = None) -> None:
        super().__init__(setup)
        self.config = cfg = config or FedMrlConfig()
        self.data = data = setup.data
        image_shape = tuple(data.train_images.shape[1:])
        small = shared_small_model(setup, cfg.small_latent_dim)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(setup.seed)  # the node's own part starts where the node's seed puts it
            own = make_backbone(setup.backbone, image_shape, cfg.latent_dim, setup.backbone_files)
            # Built on the CPU (the same start on any device), then moved; `small` is there already.
            self.model = Matryoshka(small, own, cfg.latent_dim, data.num_classes).to(setup.device)
        self.share = SmallShare(small, cfg.encoding)
        self.trainer = LocalTrainer.for_node(self.model, setup, cfg.training)
        self.augment = default_augment(image_shape) if cfg.augment else None
        self.view = NeighbourView(cfg.max_staleness)
        self.guard = ScaleGuard(cfg.outliers, cfg.max_staleness)
        self.graph = LearnedGraph(
            self.node_id,
            cfg.graph,
            warmup_rounds=cfg.warmup_rounds,
            explore_every=cfg.explore_every,
            explore_peers=cfg.explore_peers,
            seed=setup.seed,
        )

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        if self.augment is not None:
            images = augment(images, self.augment, self.trainer.generator)
        coarse, fine = self.model(images)
        small, large = F.cross_entropy(coarse, labels), F.cross_entropy(fine, labels)
        loss = self.config.weight_small * small + self.config.weight_large * large
        return loss, {"small_cross_entropy": small.item(), "large_cross_entropy": large.item()}

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self._loss)

    def predictors(self) -> Predictors:
        return MatryoshkaPredictors(self.model)

    def evaluate(self) -> Evaluation:
        return evaluate_predictors(self.predictors(), self.model, self.data)

    def publish(self, round: int) -> list[Outbound]:
        neighbours, explored = self.graph.targets(round)
        to = tuple(sorted({*neighbours, *explored}))
        return [Outbound(to=to, body=self.share.body())] if to else []

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        assert isinstance(body, Model)
        self.share.check(body)
        return {"model": Scale(self.share.scale_of(body.tensors), self.share.scale())}

    def end_round(self, round: int) -> None:
        models = self.view.fresh(MessageType.MODEL, round)
        if self.graph.learning(round):
            similarity = {
                peer: self.share.similarity(body, self.config.graph.similarity) for peer, body in models.items()
            }
            # Peers advertise no dataset sizes here; equal sizes leave the similarities unweighted.
            self.graph.step(similarity, dict.fromkeys((self.node_id, *similarity), 1.0))
        self.mix_models(self.share, round)
