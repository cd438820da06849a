"""A node's model put to use on new images: the preprocessing its own images had, and its
predictors frozen for use outside training (`p2pnode predict` runs them, `p2pnode export`
writes them; p2pnode/learning/predict.py does the I/O)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from ..data.datasets import _scaled
from ..data.own_data import decode_image
from ..seam import LocalData, Predictors

__all__ = ["Preprocessing", "EvaluatedModel", "frozen", "classify"]

PIXEL_SCALE = 255.0  # 8-bit pixels to [0, 1], as the node's own images and the bundled datasets


@dataclass(frozen=True)
class Preprocessing:
    """How an image file becomes the model's input, exactly as the node's own images did
    (own_data.py; the bundled datasets are in [0, 1] too): converted to grayscale (1 channel)
    or RGB (3), resized bilinearly to height × width (the aspect ratio not kept), pixels
    divided by 255. There is no mean/std normalisation (mean 0, std 1)."""

    channels: int
    height: int
    width: int

    @classmethod
    def of(cls, data: LocalData) -> Preprocessing:
        channels, height, width = data.train_images.shape[1:]
        return cls(int(channels), int(height), int(width))

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.channels, self.height, self.width

    def decode(self, source: Path | BinaryIO) -> np.ndarray:
        """uint8 pixels C×H×W; raises own_data.OwnDataError for an image that cannot be decoded."""
        return decode_image(source, self.shape)

    def batch(self, pixels: Sequence[np.ndarray]) -> torch.Tensor:
        """The model's input, float32 N×C×H×W, from decoded images."""
        return torch.from_numpy(_scaled(np.stack(pixels), PIXEL_SCALE))

    def describe(self) -> dict[str, Any]:
        """For the exported model's metadata: everything a program needs to prepare an image."""
        return {
            "channels": self.channels,
            "height": self.height,
            "width": self.width,
            "color_mode": "L" if self.channels == 1 else "RGB",  # PIL's Image.convert
            "resize": "bilinear",  # PIL's Image.resize((width, height), Image.Resampling.BILINEAR)
            "divide_by": PIXEL_SCALE,  # x = (pixels / divide_by - mean) / std, per channel
            "mean": [0.0] * self.channels,
            "std": [1.0] * self.channels,
            "layout": "NCHW float32",
        }


def frozen(predictors: Predictors) -> Predictors:
    """A copy of `predictors` in evaluation mode with no gradients: what the node's evaluation
    ran, usable from any thread while training goes on (nothing in it changes any more)."""
    copied = copy.deepcopy(predictors).eval()
    copied.requires_grad_(False)
    return copied


class EvaluatedModel:
    """What the node's latest evaluation scored, for use outside training while training goes
    on: after each evaluation `keep` copies the predictors' tensors (cheap: no module is
    copied), and `latest` makes them a frozen module the first time it is asked for them. A
    module handed out is never changed afterwards, so callers in any thread may run it."""

    def __init__(self) -> None:
        self._template: Predictors | None = None  # frozen once, never run: what modules are copied from
        self._kept: tuple[int, dict[str, torch.Tensor], str] | None = None  # round, state, chosen
        self._built: tuple[int, dict[str, torch.Tensor], Predictors] | None = None

    def keep(self, predictors: Predictors, round: int) -> None:
        """Between the algorithm's calls: `predictors` as evaluated after `round`."""
        if self._template is None:
            self._template = frozen(predictors)
        state = {name: tensor.detach().clone() for name, tensor in predictors.state_dict().items()}
        self._kept = round, state, predictors.chosen  # which predictor may change between rounds (MAPL-Auto)

    def latest(self) -> tuple[int, Predictors] | None:
        """The round and the frozen predictors of the latest evaluation; None before the first."""
        kept, built = self._kept, self._built
        if kept is None:
            return None
        if built is None or built[1] is not kept[1]:
            module = copy.deepcopy(self._template)
            module.load_state_dict(kept[1])
            module.chosen = kept[2]
            built = self._built = (kept[0], kept[1], module)
        return built[0], built[2]


@torch.no_grad()
def classify(predictors: Predictors, images: torch.Tensor) -> list[tuple[int, float]]:
    """For each image, the class the chosen predictor gives it and that class's probability
    (the softmax of its logits; for an ensemble, its members' mean probability)."""
    device = next(predictors.parameters()).device
    probabilities = torch.softmax(predictors(images.to(device)).float(), dim=1).cpu()
    best, classes = probabilities.max(dim=1)
    return list(zip(classes.tolist(), best.tolist(), strict=True))
