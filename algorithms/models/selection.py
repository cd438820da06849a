"""Choosing the predictor a node serves on images it never trained on (issue #44: a device must
never be worse off for joining).

The node holds out a share of each class's training images (`hold_out`): none of its models,
the collaborative ones or the local-only one, trains on them until the choice is made. After
each round it scores every predictor on them (`held_out_accuracy`), and `Chooser` decides
whether the collaborative predictor is served or another that is clearly better there.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..interface import LocalData, Predictors
from .training import seeded_generator

__all__ = ["Choice", "Chooser", "HeldOut", "held_out_accuracy", "hold_out"]

HOLD_OUT_STREAM = 7  # the node seed's stream for the draw (the trainer's batches use 1)
TOLERANCE = 1e-9  # 0.9 − 0.8 is a margin of 0.1, not 0.0999…


@dataclass(frozen=True)
class HeldOut:
    """A node's training shard cut in two: what it trains on, and what it chooses on."""

    fit: LocalData  # the shard less the held-out images; the test split unchanged
    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


def hold_out(data: LocalData, fraction: float, seed: int) -> HeldOut | None:
    """Of each class with n ≥ 2 training images, round(n · fraction) of them (at least 1, at
    most n − 1, so every class still trains), drawn with the node's seed; None where no class
    has two images or `fraction` is 0."""
    if not 0 <= fraction < 1:
        raise ValueError(f"the held-out fraction must be in [0, 1), got {fraction}")
    if fraction == 0:
        return None
    generator = seeded_generator(seed, HOLD_OUT_STREAM)
    labels = data.train_labels.cpu()
    held: list[torch.Tensor] = []
    for k in range(data.num_classes):
        members = torch.nonzero(labels == k).flatten()
        n = len(members)
        if n < 2:
            continue
        take = min(n - 1, max(1, round(n * fraction)))
        held.append(members[torch.randperm(n, generator=generator)][:take])
    if not held:
        return None
    chosen = torch.zeros(len(labels), dtype=torch.bool)
    chosen[torch.cat(held)] = True
    keep, out = (~chosen).to(data.train_labels.device), chosen.to(data.train_labels.device)
    fit = dataclasses.replace(data, train_images=data.train_images[keep], train_labels=data.train_labels[keep])
    return HeldOut(fit=fit, images=data.train_images[out], labels=data.train_labels[out])


@dataclass(frozen=True)
class Choice:
    """The predictor a node serves, and why: each predictor's accuracy on the held-out images,
    the mean over the last `rounds` scorings."""

    chosen: str
    accuracy: Mapping[str, float] = field(default_factory=dict)
    images: int = 0
    rounds: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "accuracy": dict(self.accuracy), "images": self.images, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> Choice:
        accuracy = {str(name): float(value) for name, value in state["accuracy"].items()}
        return cls(str(state["chosen"]), accuracy, int(state["images"]), int(state["rounds"]))


@torch.no_grad()
def held_out_accuracy(predictors: Predictors, model: nn.Module, held: HeldOut) -> dict[str, float]:
    """Each predictor's accuracy on `held`'s images. `model` holds every parameter they use: it
    is put in evaluation mode meanwhile."""
    was_training = model.training
    model.eval()
    try:
        outputs = predictors.all(held.images)
    finally:
        model.train(was_training)
    return {name: float((logits.argmax(1) == held.labels).float().mean()) for name, logits in outputs.items()}


class Chooser:
    """Serves the collaborative predictor unless another gets more of the held-out images right
    by at least `margin` (accuracy, the mean over the last `window` rounds); of several that do,
    the best.

    A node holds out a handful of images (ten, with ten a class and five classes): one image is
    ten points, so a choice on one round's count follows the noise. Tried on seeds 0-2 (mnist5k,
    one backbone, 40 rounds), serving whichever of five predictors scored best served 0.9
    points less than the own model alone with 4 nodes, 0.1 more with 3. The margin keeps what
    the network gave unless training alone is clearly better, as where a node's neighbours
    pulled it away from its classes, or where its own model learns too slowly to be of use yet
    and the small shared one does (a ShuffleNet from scratch on 32 images a class, 30 rounds:
    own model 37 %, the small model 94 %, Local 65 %: tools/bench/pretrained.py, seed 4)."""

    def __init__(self, window: int, margin: float) -> None:
        if window < 1 or not 0 <= margin <= 1:
            raise ValueError(f"the choice needs a window ≥ 1 and a margin in [0, 1], got {window}, {margin}")
        self.margin = margin
        self.scores: deque[dict[str, float]] = deque(maxlen=window)

    def update(
        self, accuracy: Mapping[str, float], images: int, collaborative: str, alternatives: Sequence[str]
    ) -> Choice:
        self.scores.append(dict(accuracy))
        means = {name: statistics.fmean(s[name] for s in self.scores if name in s) for name in accuracy}
        better = [
            name
            for name in alternatives
            if name != collaborative and means[name] - means[collaborative] >= self.margin - TOLERANCE
        ]
        chosen = max(better, key=lambda name: means[name]) if better else collaborative  # ties: the first listed
        return Choice(chosen, means, images, len(self.scores))

    def state_dict(self) -> list[dict[str, float]]:
        return [dict(each) for each in self.scores]

    def load_state_dict(self, state: list[dict[str, float]]) -> None:
        self.scores.clear()
        self.scores.extend({str(name): float(value) for name, value in each.items()} for each in state)
