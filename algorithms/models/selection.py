"""Choosing the predictor a node serves (issue #44: a device must never be worse off for joining).

Two ways, one `Chooser`. With `validation_fraction` > 0 the node holds out a share of each
class's training images (`hold_out`): none of its models, the collaborative ones or the
local-only one, trains on them until the choice is made. With nothing held out (the default) it
checks its predictors on a sample of its own training images (`training_sample`): that cannot
tell which generalises better, only which cannot even fit the node's data (a model that learns
too slowly). After each round it scores every predictor on them (`held_out_right`), and
`Chooser` decides whether the collaborative predictor is served or another that is clearly
better there.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..interface import LocalData, Predictors
from .training import seeded_generator

__all__ = ["Choice", "Chooser", "HeldOut", "held_out_right", "hold_out", "sign_test_p", "training_sample"]

HOLD_OUT_STREAM = 7  # the node seed's stream for the draw (the trainer's batches use 1)
TOLERANCE = 1e-9  # 0.9 − 0.8 is a margin of 0.1, not 0.0999…


@dataclass(frozen=True)
class HeldOut:
    """What a node trains on (`fit`), and the images it chooses on: held out of its shard
    (`hold_out`), or a sample of the shard itself (`training_sample`)."""

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


def training_sample(data: LocalData, most: int, seed: int) -> HeldOut:
    """Up to `most` of the node's training images, drawn with its seed: what it checks its
    predictors fit when it holds nothing out (`fit` is the whole shard: every model trains on
    all of it)."""
    if most < 1:
        raise ValueError(f"the training sample needs at least one image, got {most}")
    count = len(data.train_labels)
    order = torch.randperm(count, generator=seeded_generator(seed, HOLD_OUT_STREAM))[:most]
    order = order.to(data.train_labels.device)
    return HeldOut(fit=data, images=data.train_images[order], labels=data.train_labels[order])


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
def held_out_right(predictors: Predictors, model: nn.Module, held: HeldOut) -> dict[str, list[bool]]:
    """For each predictor, which of `held`'s images it gets right. `model` holds every parameter
    they use: it is put in evaluation mode meanwhile."""
    was_training = model.training
    model.eval()
    try:
        outputs = predictors.all(held.images)
    finally:
        model.train(was_training)
    return {name: (logits.argmax(1) == held.labels).tolist() for name, logits in outputs.items()}


def sign_test_p(wins: int, losses: int) -> float:
    """One-sided exact sign test: the chance of `wins` or more of `wins + losses` fair coin flips
    (how likely a predictor that is no better wins that often where the two disagree)."""
    n = wins + losses
    return sum(math.comb(n, i) for i in range(wins, n + 1)) / 2**n


class Chooser:
    """Serves the collaborative predictor unless another is clearly better on the images the
    node chooses on (held out, or with nothing held out its training images): right on at least
    `margin` more of them (mean over the last `window` rounds) and
    significantly so, by a sign test over the images where the two disagree (`max_p`); of
    several that are, the best.

    A node holds out a handful of images (two a class, with ten a class): one image is five or
    ten points, and every round scores the same images, so averaging rounds smooths the training's
    noise but not which images were drawn. With the margin alone (ten points), the choice
    followed that draw: on the fleet-shape benchmark's seeds 16-18 (mnist5k, four backbones) it
    served training alone, the small model or a mix instead of the ensemble on 6 of 21 nodes, on 5
    of them 2-10 points below the ensemble on the test images (BENCHMARKS.md, "Fresh seeds
    16-18"; the test was chosen on seeds 0-2).
    The test keeps what the network gave unless training alone is far better, as where a node's
    neighbours pulled it away from its classes, or where its own model learns too slowly to be of
    use yet and the small shared one does (a ShuffleNet from scratch on 32 images a class, 30
    rounds: own model 37 %, the small model 94 %, Local 65 %: tools/bench/pretrained.py, seed 4)."""

    def __init__(self, window: int, margin: float, max_p: float = 0.05) -> None:
        if window < 1 or not 0 <= margin <= 1 or not 0 < max_p <= 1:
            raise ValueError(
                f"the choice needs a window ≥ 1, a margin in [0, 1] and max_p in (0, 1]: {window}, {margin}, {max_p}"
            )
        self.margin, self.max_p = margin, max_p
        self.scores: deque[dict[str, list[bool]]] = deque(maxlen=window)

    def update(self, right: Mapping[str, Sequence[bool]], collaborative: str, alternatives: Sequence[str]) -> Choice:
        """`right`: for each predictor, which of the images chosen on it got right this round."""
        self.scores.append({name: [bool(x) for x in each] for name, each in right.items()})
        images = len(right[collaborative])
        means = {name: statistics.fmean(_share(s[name]) for s in self.scores if name in s) for name in right}
        # Only predictors the node holds this round (MAPL-Auto's local model leaves once it stops training).
        candidates = [name for name in alternatives if name in right and name != collaborative]
        better = [name for name in candidates if self._clearly_better(name, collaborative)]
        chosen = max(better, key=lambda name: means[name]) if better else collaborative  # ties: the first listed
        return Choice(chosen, means, images, len(self.scores))

    def _clearly_better(self, name: str, collaborative: str) -> bool:
        rounds = [s for s in self.scores if name in s and collaborative in s]
        if not rounds:
            return False
        pairs = [list(zip(s[name], s[collaborative], strict=True)) for s in rounds]
        wins = statistics.fmean(sum(a and not b for a, b in each) for each in pairs)
        losses = statistics.fmean(sum(b and not a for a, b in each) for each in pairs)
        images = len(rounds[-1][collaborative])
        if (wins - losses) / images < self.margin - TOLERANCE:
            return False
        return sign_test_p(round(wins), round(losses)) <= self.max_p

    def state_dict(self) -> list[dict[str, list[bool]]]:
        return [{name: list(each) for name, each in s.items()} for s in self.scores]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        """A checkpoint's window; one written before the choice kept each image (a share a
        predictor) starts the window afresh."""
        self.scores.clear()
        for each in state:
            if all(isinstance(value, list) for value in each.values()):
                self.scores.append({str(name): [bool(x) for x in value] for name, value in each.items()})


def _share(right: Sequence[bool]) -> float:
    return sum(right) / len(right) if right else 0.0
