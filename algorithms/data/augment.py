"""Random augmentations of image batches: the two views of the supervised contrastive loss.

Pure tensor operations on whole N×C×H×W batches (one random affine transform per image, applied
by `affine_grid` + `grid_sample`), so augmenting costs little next to a training step on CPU. All
randomness comes from the `torch.Generator` passed in: the same generator state gives the same
views, whatever else has drawn from torch's global RNG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["AugmentSpec", "augment", "default_augment", "two_views"]


@dataclass(frozen=True)
class AugmentSpec:
    """Ranges of the random transform; every parameter is drawn uniformly, per image."""

    max_shift: float = 0.125  # translation, as a fraction of the image side (28 px → ±3.5 px)
    max_rotation_deg: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)  # zoom factor; above 1 enlarges the content
    noise_std: float = 0.0  # additive Gaussian noise, in pixel-value units
    horizontal_flip: bool = False  # with probability 1/2; for natural images, not for digits

    def __post_init__(self) -> None:
        low, high = self.scale
        if not 0 < low <= high:
            raise ValueError(f"scale must be (low, high) with 0 < low <= high, not {self.scale!r}")
        if self.max_shift < 0 or self.max_rotation_deg < 0 or self.noise_std < 0:
            raise ValueError("max_shift, max_rotation_deg and noise_std must not be negative")


def augment(images: Tensor, spec: AugmentSpec, generator: torch.Generator) -> Tensor:
    """`images` (N×C×H×W, floating point), each under its own random affine transform; pixels
    from outside the image read as zero."""
    if images.dim() != 4 or not images.is_floating_point():
        raise ValueError(f"augment needs a floating-point N×C×H×W batch, not {images.dtype} {tuple(images.shape)}")
    count, _, height, width = images.shape

    def uniform(low: float, high: float) -> Tensor:
        draws = torch.rand(count, generator=generator, device=generator.device, dtype=torch.float64)
        return (low + (high - low) * draws).to(images.device)

    angle = torch.deg2rad(uniform(-spec.max_rotation_deg, spec.max_rotation_deg))
    # Log-uniform, so that zooming in by s and out by 1/s are equally likely.
    scale = torch.exp(uniform(math.log(spec.scale[0]), math.log(spec.scale[1])))
    # affine_grid's coordinates span [-1, 1]: a shift by a fraction f of the side is 2f.
    shift_x = 2 * uniform(-spec.max_shift, spec.max_shift)
    shift_y = 2 * uniform(-spec.max_shift, spec.max_shift)
    flip = torch.ones(count, dtype=torch.float64, device=images.device)
    if spec.horizontal_flip:
        flip = torch.where(uniform(0, 1) < 0.5, -flip, flip)

    # The grid maps each output pixel to where it samples the input: the inverse of "flip, zoom,
    # rotate, shift". Rotation is done in pixel units (hence the aspect ratio) so that a
    # non-square image turns rather than shears.
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    aspect = width / height
    theta = torch.stack(
        [
            torch.stack([flip * cos, flip * sin / aspect, -flip * (cos * shift_x + sin * shift_y / aspect)], dim=1),
            torch.stack([-sin * aspect, cos, sin * aspect * shift_x - cos * shift_y], dim=1),
        ],
        dim=1,
    )
    grid = F.affine_grid(theta.to(images.dtype), list(images.shape), align_corners=False)
    out = F.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    if spec.noise_std > 0:
        noise = torch.randn(out.shape, generator=generator, device=generator.device, dtype=out.dtype)
        out = out + spec.noise_std * noise.to(out.device)
    return out


def two_views(images: Tensor, spec: AugmentSpec, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Two independently augmented copies of `images`: each image's positive pair."""
    return augment(images, spec, generator), augment(images, spec, generator)


def default_augment(image_shape: Sequence[int]) -> AugmentSpec:
    """Sensible ranges for an image shape (C, H, W).

    Colour images (CIFAR/SVHN-like) also flip horizontally; tiny images (8×8 digits) move by at
    most half a pixel and turn less, since one pixel there is an eighth of the digit.
    """
    channels, height, width = image_shape
    if min(height, width) < 16:
        return AugmentSpec(max_shift=0.5 / min(height, width), max_rotation_deg=8.0, scale=(0.95, 1.05))
    return AugmentSpec(horizontal_flip=channels == 3)
