"""MAPL-Dual: heterogeneous nodes that gain from each other through a small shared model.

MAPL's prototypes give heterogeneous nodes the right graph but little knowledge (BENCHMARKS.md);
parameters carry knowledge but need one architecture. FedMRL's answer, carried over to MAPL:
node i keeps its own heterogeneous model H_i, trained with MAPL's PML loss, and also trains a
small homogeneous model S_i (algorithms/models/small.py: the same architecture and initial weights on
every node).

- Local step, on the same two augmented views: PML(H_i) + cross-entropy(S_i), and after warm-up
  λ · T² · KL distillation from S_i into H_i (by default; into S_i too, or instead, as set).
- On the wire: MAPL's PROTOTYPES (without H's head, which nothing needs any more) and S_i as one
  MODEL payload (its backbone, and its head for the graph), to the same peers.
- Graph: CGL on the similarity of S's head updates since the common start. S's heads are
  homogeneous and start alike, so they compare across nodes. That head is never averaged
  (small.py says why) and by default nothing is distilled into S, so H cannot blur the graph.
- Aggregation with the learned row w: ξ_i ← Σ_j w_ij ξ_j, and S_i's backbone ← Σ_j w_ij S_j's
  (BatchNorm statistics included).
- Prediction: H_i, S_i, or the ensemble of both (mean of their class probabilities); the
  evaluation reports all three.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from protocol.messages import Body, MessageType, Model

from ..graphs.graph import GraphConfig
from ..interface import Evaluation, LocalReport, NodeSetup, Outbound, Predictors
from ..models.losses import better_on_label, distillation, ensemble_logits
from ..models.small import SmallShare, shared_small_model
from ..models.training import LocalTrainer, evaluate_predictors
from ..outliers import Scale
from ..payloads import ENCODINGS
from .mapl import Mapl, MaplConfig

__all__ = ["DISTILL_WHERE", "DualConfig", "DualPredictors", "MaplDual", "PREDICTORS"]

PREDICTORS = ("personal", "shared", "ensemble")
DISTILL_INTO = ("both", "small", "personal")
DISTILL_WHERE = ("all", "teacher_better")


@dataclass(frozen=True)
class DualConfig(MaplConfig):
    # S's heads are homogeneous on features every node shares: their updates compare row by row.
    # (update-gram, MAPL's default for heterogeneous heads, separated the clusters 5× slower.)
    graph: GraphConfig = field(default_factory=lambda: GraphConfig(similarity="update-cosine"))
    small_latent_dim: int = 64  # the small model's representation width
    weight_small: float = 1.0  # the small model's cross-entropy
    distill_weight: float = 1.0  # λ of the distillation terms
    distill_temperature: float = 2.0  # T
    # Which model learns from the other: "personal" (S into H), "small" (H into S) or "both".
    # Distilling into S moves S's head, the graph's evidence, towards what H believes: mass stayed
    # 1.0, but L1 to the true graph rose from 0.07 to 0.19 and from 0.16 to 0.27 (BENCHMARKS.md).
    distill_into: str = "personal"
    distill_after: int | None = None  # the first round with distillation (default: the end of warm-up)
    # "all": every sample teaches; "teacher_better": only those where the teacher gives the true
    # label more probability than the student (a weaker teacher pulls a stronger model down elsewhere)
    distill_where: str = "all"
    predict: str = "ensemble"  # "personal" (H) | "shared" (S) | "ensemble"
    encoding: str = "float32"  # how S travels: "float32" | "float16"
    predict_choices: ClassVar[tuple[str, ...]] = PREDICTORS
    distill_where_choices: ClassVar[tuple[str, ...]] = DISTILL_WHERE

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.small_latent_dim < 1:
            raise ValueError("small_latent_dim must be ≥ 1")
        if self.weight_small < 0 or self.distill_weight < 0:
            raise ValueError("weight_small and distill_weight must be ≥ 0")
        if not self.distill_temperature > 0:
            raise ValueError("distill_temperature must be > 0")
        if self.distill_after is not None and self.distill_after < 0:
            raise ValueError("distill_after must be ≥ 0")
        if self.distill_where not in self.distill_where_choices:
            choices = ", ".join(self.distill_where_choices)
            raise ValueError(f"distill_where must be one of {choices}, got {self.distill_where!r}")
        if self.distill_into not in DISTILL_INTO:
            raise ValueError(f"distill_into must be one of {', '.join(DISTILL_INTO)}, got {self.distill_into!r}")
        if self.predict not in self.predict_choices:
            raise ValueError(f"predict must be one of {', '.join(self.predict_choices)}, got {self.predict!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")

    @property
    def first_distilled_round(self) -> int:
        return self.warmup_rounds if self.distill_after is None else self.distill_after


class DualPredictors(Predictors):
    """H (the node's own model, head on backbone), S, and their ensemble."""

    def __init__(self, personal: nn.Module, shared: nn.Module, chosen: str) -> None:
        super().__init__(chosen)
        self.backbone, self.head, self.shared = personal.backbone, personal.head, shared

    def all(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        personal, shared = self.head(self.backbone(images)), self.shared(images)
        return {"personal": personal, "shared": shared, "ensemble": ensemble_logits(personal, shared)}


class MaplDual(Mapl):
    """MAPL on the node's own model, plus a small shared model mixed over the learned graph."""

    name = "mapl-dual"
    config_type = DualConfig
    sends = frozenset({MessageType.PROTOTYPES, MessageType.MODEL})
    waits_for = frozenset({MessageType.PROTOTYPES, MessageType.MODEL})
    judged_parts: ClassVar[Mapping[MessageType, str]] = {**Mapl.judged_parts, MessageType.MODEL: "model"}

    def __init__(self, setup: NodeSetup, config: DualConfig | None = None) -> None:
        super().__init__(setup, config or DualConfig())
        cfg: DualConfig = self.config
        self.small = shared_small_model(setup, cfg.small_latent_dim)
        self.share = SmallShare(self.small, cfg.encoding)
        # One optimiser over both models: they train on the same batches, in one backward pass.
        both = nn.ModuleDict({"personal": self.model, "shared": self.small})
        self.trainer = LocalTrainer.for_node(both, setup, cfg.training)
        self.distilling = False

    # -- local step and prediction ----------------------------------------------------------

    def local_step(self, round: int) -> LocalReport:
        self.distilling = round >= self.config.first_distilled_round
        return self.trainer.run(self._dual_loss)

    def _dual_loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg: DualConfig = self.config
        views, both = self._views(images, labels)
        out = self.model(views)
        small_logits = self.small(views)
        loss, parts = self._pml_terms(out, both)
        parts["small_cross_entropy"] = F.cross_entropy(small_logits, both)
        loss = loss + cfg.weight_small * parts["small_cross_entropy"]
        if self.distilling and cfg.distill_weight > 0:
            temperature, gated = cfg.distill_temperature, self.distill_where() == "teacher_better"
            personal, small = out.logits.detach(), small_logits.detach()
            if cfg.distill_into in ("both", "small"):
                where = better_on_label(personal, small, both) if gated else None
                parts["distill_into_small"] = distillation(small_logits, personal, temperature, where)
                loss = loss + cfg.distill_weight * parts["distill_into_small"]
            if cfg.distill_into in ("both", "personal"):
                where = better_on_label(small, personal, both) if gated else None
                parts["distill_into_personal"] = distillation(out.logits, small, temperature, where)
                loss = loss + cfg.distill_weight * parts["distill_into_personal"]
        return loss, {name: value.item() for name, value in parts.items()}

    def distill_where(self) -> str:
        """Which samples teach this round (`DualConfig.distill_where`)."""
        return self.config.distill_where

    def predictors(self) -> Predictors:
        return DualPredictors(self.model, self.small, self.config.predict)

    def evaluate(self) -> Evaluation:
        return evaluate_predictors(self.predictors(), self.trainer.model, self.data)

    # -- publish and receive ----------------------------------------------------------------

    def publish(self, round: int) -> list[Outbound]:
        neighbours, explored = self.graph.targets(round)
        to = tuple(sorted({*neighbours, *explored}))
        if not to:
            return []
        return [Outbound(to=to, body=self._prototypes(with_head=False)), Outbound(to=to, body=self.share.body())]

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        if not isinstance(body, Model):
            return super().inspect(peer, round, body)
        self.share.check(body)
        return {"model": Scale(self.share.scale_of(body.tensors), self.share.scale())}

    # -- graph step and aggregation ---------------------------------------------------------

    def _similarities(self, round: int) -> dict[str, float]:
        models = self.view.fresh(MessageType.MODEL, round)
        return {peer: self.share.similarity(body, self.config.graph.similarity) for peer, body in models.items()}

    def end_round(self, round: int) -> None:
        super().end_round(round)  # graph step, prototypes
        self.mix_models(self.share, round)
