"""Local training machinery shared by the algorithms: seeded batches, optimisers, evaluation."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..interface import Evaluation, LocalData, LocalReport, NodeSetup, Predictors
from .personal import ModelSpec, PersonalModel, make_model
from .statistics import refresh_statistics

__all__ = [
    "TrainingConfig",
    "LocalTrainer",
    "TrainedLocally",
    "ModelPredictor",
    "evaluate_predictors",
    "seeded_generator",
    "node_model",
]


@dataclass(frozen=True)
class TrainingConfig:
    """The local optimiser: E epochs over the node's shard per round, in minibatches."""

    local_epochs: int = 1
    batch_size: int = 32
    optimizer: str = "adam"  # "adam" | "sgd"
    learning_rate: float = 1e-3
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.local_epochs < 1 or self.batch_size < 1:
            raise ValueError("training.local_epochs and training.batch_size must be ≥ 1")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"training.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"training.learning_rate must be > 0, got {self.learning_rate}")
        if not (0 <= self.momentum < 1 and self.weight_decay >= 0):
            raise ValueError("training.momentum must be in [0, 1) and training.weight_decay ≥ 0")


def seeded_generator(*seed: int) -> torch.Generator:
    """A torch generator from a tuple of ints (e.g. run seed, node index, purpose)."""
    value = 0
    for part in seed:
        value = (value * 1_000_003 + int(part)) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


def _make_optimizer(parameters, config: TrainingConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(
            parameters, lr=config.learning_rate, momentum=config.momentum, weight_decay=config.weight_decay
        )
    return torch.optim.Adam(parameters, lr=config.learning_rate, weight_decay=config.weight_decay)


def node_model(
    setup: NodeSetup,
    seed: int,
    *,
    latent_dim: int,
    projection_dim: int = 1,
    head_seed: int | None = None,
    prototypes_seed: int | None = None,
) -> tuple[ModelSpec, PersonalModel]:
    """A model of the node's backbone for its data, initialised from `seed`: the node's own
    seed for a personal start, the network's shared seed where every node must start alike;
    its head re-initialised from `head_seed` if given (a head shared by every node), and its
    prototypes from `prototypes_seed` (prototypes shared by every node). Built on the CPU, so it
    starts alike on every device, then moved to the node's device. The global torch RNG is left
    as it was."""
    data = setup.data
    spec = ModelSpec(
        backbone=setup.backbone,
        files=setup.backbone_files,
        image_shape=tuple(data.train_images.shape[1:]),
        num_classes=data.num_classes,
        latent_dim=latent_dim,
        projection_dim=projection_dim,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make_model(spec)
        if head_seed is not None:
            torch.manual_seed(head_seed)
            model.head.reset_parameters()
        if prototypes_seed is not None:
            model.reset_prototypes(seeded_generator(prototypes_seed))
    return spec, model.to(setup.device)


class LocalTrainer:
    """Runs `local_epochs` epochs of a loss over shuffled minibatches of the node's shard.

    The optimiser (and its moments) lives as long as the node, not just one round.
    """

    @classmethod
    def for_node(cls, model: nn.Module, setup: NodeSetup, config: TrainingConfig) -> LocalTrainer:
        """A trainer of `model` (on the node's device) over the node's training shard; batches
        are drawn with the node's seed, with mixed precision if the node asks for it."""
        data = setup.data
        return cls(
            model,
            data.train_images,
            data.train_labels,
            config,
            seeded_generator(setup.seed, 1),
            mixed_precision=setup.mixed_precision,
        )

    def __init__(
        self,
        model: nn.Module,
        images: torch.Tensor,
        labels: torch.Tensor,
        config: TrainingConfig,
        generator: torch.Generator,
        *,
        mixed_precision: bool = False,
    ) -> None:
        self.model = model
        self.images = images
        self.labels = labels
        self.config = config
        self.generator = generator  # on the CPU: the same draws on every device
        self.optimizer = _make_optimizer(model.parameters(), config)
        # float16 gradients underflow without the scaler; it skips a step whose gradients overflowed.
        self.scaler = torch.amp.GradScaler("cuda") if mixed_precision else None

    def state_dict(self) -> dict[str, Any]:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
        }
        return state if self.scaler is None else {**state, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, from tensors on any device: modules and the
        optimiser copy them to where their parameters are."""
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"].cpu())
            if self.scaler is not None and "scaler" in state:  # absent: saved without mixed precision
                self.scaler.load_state_dict(state["scaler"])
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"the saved training state does not fit this model: {exc}") from None

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.labels), generator=self.generator).to(self.labels.device)
        size = self.config.batch_size
        # A last batch of one sample would break BatchNorm; fold it into the previous one.
        starts = list(range(0, len(order), size))
        if len(starts) > 1 and len(order) - starts[-1] < 2:
            starts.pop()
        for index, start in enumerate(starts):
            end = starts[index + 1] if index + 1 < len(starts) else len(order)
            chosen = order[start:end]
            yield self.images[chosen], self.labels[chosen]

    def run(
        self, loss_of_batch: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]
    ) -> LocalReport:
        self.model.train()
        total, steps, samples = 0.0, 0, 0
        parts: dict[str, float] = {}
        for _ in range(self.config.local_epochs):
            for images, labels in self.batches():
                with self._precision():
                    loss, batch_parts = loss_of_batch(images, labels)
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"local loss became {loss.item()}; lower training.learning_rate")
                self.optimizer.zero_grad(set_to_none=True)
                self._descend(loss)
                total += loss.item()
                for key, value in batch_parts.items():
                    parts[key] = parts.get(key, 0.0) + value
                steps += 1
                samples += len(labels)
        return LocalReport(
            loss=total / steps, parts={k: v / steps for k, v in parts.items()}, steps=steps, samples=samples
        )

    def _precision(self) -> AbstractContextManager:
        """float16 autocast for the forward pass and the loss under mixed precision."""
        return torch.autocast("cuda", dtype=torch.float16) if self.scaler is not None else nullcontext()

    def _descend(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()


class TrainedLocally:
    """For algorithms with one `model` trained by one `trainer` on `data`: evaluation on the
    node's own test split, and the checkpoint of model, optimiser and data order."""

    model: nn.Module
    trainer: LocalTrainer
    data: LocalData

    def predictors(self) -> Predictors:
        return ModelPredictor(self.model)

    def evaluate(self) -> Evaluation:
        return evaluate_predictors(self.predictors(), self.model, self.data)

    def cross_entropy(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """The plain supervised loss of the model's classifier, for `trainer.run`."""
        loss = F.cross_entropy(self.model.classify(images), labels)
        return loss, {"cross_entropy": loss.item()}

    def state_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state["trainer"])


class ModelPredictor(Predictors):
    """One model's classifier, `PersonalModel.classify`: its head on its backbone."""

    def __init__(self, model: PersonalModel) -> None:
        super().__init__("model")
        self.backbone, self.head = model.backbone, model.head

    def all(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"model": self.head(self.backbone(images))}


@torch.no_grad()
def evaluate_predictors(predictors: Predictors, model: nn.Module, data: LocalData, batch_size: int = 512) -> Evaluation:
    """Accuracy on the node's own test split of `predictors.chosen`, also restricted to its own
    classes (SCooL's measure); with several predictors (one forward pass feeds them all), the
    accuracy of each goes into `by_predictor`. `model` holds every parameter they use: it is put
    in evaluation mode meanwhile, after the BatchNorm statistics the predictors run on are
    recomputed from the node's training images (statistics.py says why)."""
    refresh_statistics(predictors.all, model, data.train_images)
    was_training = model.training
    model.eval()
    own = torch.zeros(data.num_classes, dtype=torch.bool, device=data.test_labels.device)
    own[list(data.own_classes)] = True
    correct: dict[str, int] = {}
    own_correct = 0
    loss = 0.0
    predicted: list[int] = []
    right: list[bool] = []
    chosen = predictors.chosen
    for start in range(0, len(data.test_labels), batch_size):
        images = data.test_images[start : start + batch_size]
        labels = data.test_labels[start : start + batch_size]
        outputs = predictors.all(images)
        for name, each in outputs.items():
            correct[name] = correct.get(name, 0) + int((each.argmax(1) == labels).sum())
        logits = outputs[chosen]
        predicted += logits.argmax(1).tolist()
        right += (logits.argmax(1) == labels).tolist()
        loss += F.cross_entropy(logits, labels, reduction="sum").item()
        own_correct += int((logits.masked_fill(~own, -math.inf).argmax(1) == labels).sum())
    model.train(was_training)
    total = len(data.test_labels)
    return Evaluation(
        correct=correct.get(chosen, 0),
        total=total,
        own_class_correct=own_correct,
        loss=loss / total if total else float("nan"),
        by_predictor={name: hits / total for name, hits in correct.items()} if len(correct) > 1 and total else {},
        predictor=chosen if len(correct) > 1 else "",
        predicted=tuple(predicted),
        right=tuple(right),
    )
