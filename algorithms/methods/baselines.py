"""Baselines that users compare MAPL against.

- FedProto-style prototype averaging (`fedproto`): each node publishes the class means of its
  latent features; every node averages them over all peers (weighted by sample counts) and adds
  a regulariser pulling its features of class k to the network's prototype of k. No graph.
- DFedAvgM (Sun et al. 2022): local SGD with momentum, then uniform averaging of the whole model
  with all peers. Needs one backbone everywhere; learns one model per cluster of nobody.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from protocol.messages import Body, MessageType, Model, Prototypes

from ..interface import Algorithm, LocalReport, NeighbourView, NodeSetup, Outbound, uniform_row
from ..models.statistics import refresh_statistics
from ..models.training import LocalTrainer, TrainedLocally, TrainingConfig, node_model
from ..outliers import OutlierConfig, Scale, ScaleGuard, fold_into_self, row_scale
from ..payloads import SharedModules, check_prototypes, to_numpy

__all__ = ["FedProtoConfig", "FedProto", "DFedAvgMConfig", "DFedAvgM"]


class _AllPeersUniform(TrainedLocally, Algorithm):
    """Sends its one payload type to every peer and weighs everyone alike: W is all-to-all
    uniform, self included, except that a peer whose payloads are refused (`guard`,
    outliers.py) leaves its weight to the node."""

    view: NeighbourView
    guard: ScaleGuard

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.view.set_peers(self.peers)
        self.guard.set_peers(self.peers)

    def weights(self) -> dict[str, float]:
        return fold_into_self(uniform_row(self.node_id, self.peers), self.node_id, self.guard.distrusted())

    def expected(self, round: int) -> tuple[str, ...]:
        """Everyone at round 0; afterwards whoever sent last round (a peer that stopped costs
        one wait, not one per round)."""
        (payload_type,) = self.sends
        return self.peers if round == 0 else self.view.senders_since(payload_type, round - 1)


@dataclass(frozen=True)
class FedProtoConfig:
    training: TrainingConfig = field(default_factory=TrainingConfig)
    latent_dim: int = 128
    prototype_weight: float = 1.0  # λ of FedProto's regulariser
    max_staleness: int = 1
    outliers: OutlierConfig = field(default_factory=OutlierConfig)  # prototypes off the neighbourhood's scale


class FedProto(_AllPeersUniform):
    name = "fedproto"
    sends = frozenset({MessageType.PROTOTYPES})
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.PROTOTYPES: "prototypes"}
    config_type = FedProtoConfig

    def __init__(self, setup: NodeSetup, config: FedProtoConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or FedProtoConfig()
        self.data = setup.data
        self.spec, self.model = node_model(setup, setup.seed, latent_dim=config.latent_dim)
        self.trainer = LocalTrainer.for_node(self.model, setup, config.training)
        self.view = NeighbourView(config.max_staleness)
        self.guard = ScaleGuard(config.outliers, config.max_staleness)
        self.global_prototypes: dict[int, torch.Tensor] = {}
        self._own: Prototypes | None = None  # what this node published last

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        latent = self.model.latent(images)
        ce = F.cross_entropy(self.model.head(latent), labels)
        known = [i for i, label in enumerate(labels.tolist()) if label in self.global_prototypes]
        if known:
            targets = torch.stack([self.global_prototypes[int(labels[i])] for i in known])
            proto = F.mse_loss(latent[known], targets)
        else:
            proto = latent.sum() * 0.0
        return ce + self.config.prototype_weight * proto, {"cross_entropy": ce.item(), "prototype": proto.item()}

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self._loss)

    @torch.no_grad()
    def _class_means(self) -> tuple[tuple[int, ...], tuple[int, ...], np.ndarray]:
        # With the statistics evaluation uses (statistics.py): from the first round, not only once
        # evaluated, else round 0's prototypes stand far off the next rounds' and a neighbourhood
        # that heard both refuses them as off its scale.
        refresh_statistics(self.model.latent, self.model, self.data.train_images)
        self.model.eval()
        latent = self.model.latent(self.data.train_images)
        self.model.train()
        classes = self.data.own_classes
        labels = self.data.train_labels
        means = torch.stack([latent[labels == k].mean(0) for k in classes])
        counts = tuple(int((labels == k).sum()) for k in classes)
        return classes, counts, to_numpy(means)

    def publish(self, round: int) -> list[Outbound]:
        classes, counts, means = self._class_means()
        self._own = Prototypes(classes=classes, counts=counts, prototypes=means)
        return [Outbound(to=self.peers, body=self._own)] if self.peers else []

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        assert isinstance(body, Prototypes)
        check_prototypes(body, self.spec.num_classes, self.spec.latent_dim, all_classes=False)
        own = 0.0 if self._own is None else row_scale(self._own.prototypes)
        return {"prototypes": Scale(row_scale(body.prototypes), own)}

    def end_round(self, round: int) -> None:
        sums: dict[int, np.ndarray] = {}
        totals: dict[int, int] = {}
        assert self._own is not None  # published this round
        for body in [self._own, *self.view.fresh(MessageType.PROTOTYPES, round).values()]:
            for k, n, row in zip(body.classes, body.counts, body.prototypes, strict=True):
                sums[k] = sums.get(k, 0.0) + n * row.astype(np.float64)
                totals[k] = totals.get(k, 0) + n
        device = self.setup.device
        self.global_prototypes = {
            k: torch.tensor((sums[k] / totals[k]).astype(np.float32), device=device) for k in sums if totals[k] > 0
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_prototypes": dict(self.global_prototypes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_prototypes = {int(k): v.to(self.setup.device) for k, v in state["global_prototypes"].items()}


@dataclass(frozen=True)
class DFedAvgMConfig:
    training: TrainingConfig = field(
        default_factory=lambda: TrainingConfig(optimizer="sgd", learning_rate=0.01, momentum=0.9)
    )
    latent_dim: int = 128
    max_staleness: int = 1
    outliers: OutlierConfig = field(default_factory=OutlierConfig)  # models off the neighbourhood's scale


class DFedAvgM(_AllPeersUniform):
    name = "dfedavgm"
    homogeneous = True
    sends = frozenset({MessageType.MODEL})
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.MODEL: "model"}
    config_type = DFedAvgMConfig

    def __init__(self, setup: NodeSetup, config: DFedAvgMConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or DFedAvgMConfig()
        self.data = setup.data
        # One initial model for everyone, as decentralised averaging assumes.
        self.spec, self.model = node_model(setup, setup.shared_seed, latent_dim=config.latent_dim)
        self.trainer = LocalTrainer.for_node(self.model, setup, config.training)
        self.shared = SharedModules({"backbone": self.model.backbone, "head": self.model.head})
        self.view = NeighbourView(config.max_staleness)
        self.guard = ScaleGuard(config.outliers, config.max_staleness)

    def local_step(self, round: int) -> LocalReport:
        return self.trainer.run(self.cross_entropy)

    def publish(self, round: int) -> list[Outbound]:
        return [Outbound(to=self.peers, body=self.shared.body())] if self.peers else []

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        assert isinstance(body, Model)
        self.shared.check(body)
        return {"model": Scale(self.shared.scale_of(body.tensors), self.shared.scale())}

    def end_round(self, round: int) -> None:
        distrusted = self.guard.distrusted()
        models = {p: body for p, body in self.view.fresh(MessageType.MODEL, round).items() if p not in distrusted}
        weight = 1.0 / (len(models) + len(distrusted) + 1)  # a refused peer's share stays with the node
        self.shared.mix(1.0 - weight * len(models), [(weight, body) for body in models.values()])
