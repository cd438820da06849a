"""A node's model put to use on new images: the preprocessing its own images had, and its
predictors frozen for use outside training (`p2pnode predict` runs them, `p2pnode export`
writes them; p2pnode/serving/predict.py does the I/O)."""

from __future__ import annotations

import copy
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import torch

from ..data.datasets import _scaled
from ..data.own_data import decode_image
from ..interface import LocalData, Predictors

__all__ = ["Preprocessing", "EvaluatedModel", "Prediction", "KnownClasses", "frozen", "classify"]

_BATCH = 512  # images classified in one forward pass
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

    def png(self, pixels: np.ndarray) -> bytes:
        """Decoded pixels (C×H×W uint8) as a PNG file: how a node asks its peers about an image."""
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(pixels.transpose(1, 2, 0).squeeze(2) if self.channels == 1 else pixels.transpose(1, 2, 0)).save(
            buffer, format="PNG"
        )
        return buffer.getvalue()

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


class Prediction(NamedTuple):
    """What the chosen predictor says of one image."""

    label: int  # the class it gives the image, over all classes
    probability: float  # that class's softmax probability (a mix's: its members' weighted mean)
    own_probability: float  # the best of the node's own classes, softmaxed over those alone


@torch.no_grad()
def classify(predictors: Predictors, images: torch.Tensor, own_classes: Sequence[int]) -> list[Prediction]:
    """For each image, what the chosen predictor says of it (one forward pass per 512 images)."""
    device = next(predictors.parameters()).device
    own = list(own_classes)  # indexes the logits on the CPU
    predictions = []
    for start in range(0, len(images), _BATCH):
        logits = predictors(images[start : start + _BATCH].to(device)).float().cpu()
        best, labels = torch.softmax(logits, dim=1).max(dim=1)
        own_best = torch.softmax(logits[:, own], dim=1).max(dim=1).values
        predictions += map(Prediction, labels.tolist(), best.tolist(), own_best.tolist())
    return predictions


@dataclass(frozen=True)
class KnownClasses:
    """Whether an image is one of the classes a node has training images of, judged on what its
    own held-out images look like to its model (not a constant): an image is one of them when the
    chosen predictor gives it one of them (the class over all classes) with an own-class
    probability (`Prediction.own_probability`) of at least `threshold`, the `quantile` of that
    probability over the node's held-out images. About `quantile` of images of its own classes
    are then called unknown; how many images of other classes pass depends on how alike they
    look (docs/usage.md has measured rates). A node with one class cannot tell (its own-class
    probability is always 1): only the class over all classes can say no."""

    classes: tuple[int, ...]
    threshold: float
    quantile: float
    held_out: int  # images the threshold was set on

    @classmethod
    def calibrate(cls, predictors: Predictors, data: LocalData, quantile: float) -> KnownClasses:
        """The threshold from the node's test split: images it never trained on, of its classes."""
        classes = data.own_classes
        scores = [p.own_probability for p in classify(predictors, data.test_images, classes)]
        threshold = float(np.quantile(scores, quantile)) if scores else 0.0
        return cls(classes, threshold, quantile, len(scores))

    def covers(self, prediction: Prediction) -> bool:
        return prediction.label in self.classes and prediction.own_probability >= self.threshold

    def why_not(self, prediction: Prediction, names: Sequence[str]) -> str:
        """Why an image this does not cover is not one of the node's classes."""
        if prediction.label not in self.classes:
            return f"its class {names[prediction.label]} is not one this node trained on"
        return (
            f"own-class probability {prediction.own_probability:.3f} below this node's threshold "
            f"{self.threshold:.3f} ({self.quantile:g} of its {self.held_out} held-out images fall below it)"
        )

    def describe(self, names: Sequence[str]) -> dict[str, Any]:
        """For `predict`'s answer and the exported model's metadata: how to judge as the node does."""
        return {
            "known_classes": [names[k] for k in self.classes],
            "known_class_ids": list(self.classes),
            "unknown_threshold": self.threshold,
            "unknown_quantile": self.quantile,
            "threshold_held_out_images": self.held_out,
            "unknown_rule": (
                "softmax over the logits of known_class_ids alone; an image is one of them when the argmax "
                "over all logits is in known_class_ids and that softmax's largest value is >= unknown_threshold"
            ),
        }
