"""Personal models: a backbone of the peer's choice, a linear head, a projector and prototypes.

MAPL is model agnostic: peers may run different backbones. What they exchange (heads, class
prototypes) lives in spaces every backbone shares, so every backbone maps an image batch
(N×C×H×W) to the same `latent_dim`, and every projector to the same `projection_dim`.

Two families of backbones:

* CPU family (`CPU_BACKBONES`): four small, architecturally different networks, each fast enough
  to train on one CPU core, and each working on 8×8, 28×28 and 32×32 images with any channel
  count.
* GPU family (`GPU_BACKBONES`): torchvision's ImageNet architectures, randomly initialised
  (nothing is downloaded) and adapted to small images: ResNet-18 and ShuffleNetV2 get a 3×3
  stride-1 stem without max pooling; AlexNet and GoogLeNet keep their stems and see images
  upsampled to 64 px. All take any channel count and end in a Linear to `latent_dim`. Slow on CPU.

A user's own backbone, `"module:callable"`, and weights to start any backbone from:
user_backbone.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .user_backbone import NO_FILES, BackboneFiles, UserBackbone, is_user_backbone, load_weights, user_module

__all__ = [
    "BACKBONES",
    "CPU_BACKBONES",
    "GPU_BACKBONES",
    "ModelError",
    "ModelOutput",
    "ModelSpec",
    "PersonalModel",
    "SmallModel",
    "make_backbone",
    "make_model",
    "parameter_count",
]

CPU_BACKBONES: tuple[str, ...] = ("convnet", "resnet", "mobilenet", "mlp")
GPU_BACKBONES: tuple[str, ...] = ("resnet18", "shufflenet", "googlenet", "alexnet")
BACKBONES: tuple[str, ...] = CPU_BACKBONES + GPU_BACKBONES

# AlexNet's and GoogLeNet's stems (large strided kernels, many poolings) reduce a 28 or 32 px
# image to less than one pixel; these two see their input upsampled to this side instead.
UPSAMPLED_SIDE = 64


class ModelError(ValueError):
    """A model specification that cannot be built."""


@dataclass(frozen=True)
class ModelSpec:
    """What a peer's model looks like. Validated on construction."""

    backbone: str
    image_shape: tuple[int, int, int]  # C, H, W
    num_classes: int
    # The same for every backbone, so that heads and prototypes of heterogeneous peers compare.
    latent_dim: int = 128
    projection_dim: int = 128
    files: BackboneFiles = NO_FILES  # a user backbone's code folder, weights to start from

    def __post_init__(self) -> None:
        if self.backbone not in BACKBONES and not is_user_backbone(self.backbone):
            raise ModelError(
                f"unknown backbone {self.backbone!r}; known: {', '.join(BACKBONES)}, or your own as MODULE:CALLABLE"
            )
        shape = self.image_shape
        if not isinstance(shape, Sequence) or len(shape) != 3 or not all(_is_positive_int(side) for side in shape):
            raise ModelError(f"image_shape must be (channels, height, width) of positive ints, not {shape!r}")
        # Configuration files give lists; a frozen spec should hold (and hash) a tuple.
        object.__setattr__(self, "image_shape", tuple(int(side) for side in shape))
        for name in ("num_classes", "latent_dim", "projection_dim"):
            if not _is_positive_int(getattr(self, name)):
                raise ModelError(f"{name} must be a positive int, not {getattr(self, name)!r}")


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# --- CPU family ---------------------------------------------------------------------------


class ChannelsLast(nn.Module):
    """Passes activations on in NHWC memory layout, which later layers then keep.

    Why: on CPU, max pooling and batch norm run several times faster on NHWC than on NCHW.
    It follows the first convolution because a one-channel input cannot be told apart from NCHW.
    """

    def forward(self, x: Tensor) -> Tensor:
        return x.contiguous(memory_format=torch.channels_last)


def _conv_bn_relu(in_channels: int, out_channels: int, *, stride: int = 1, nhwc: bool = False) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        *([ChannelsLast()] if nhwc else []),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


def _flattened_size(features: nn.Module, image_shape: tuple[int, int, int]) -> int:
    """Width of `features`' flattened output, found by running it on one dummy image."""
    was_training = features.training
    features.eval()  # a batch of one must not touch BatchNorm's running statistics
    with torch.no_grad():
        size = features(torch.zeros(1, *image_shape)).flatten(1).shape[1]
    features.train(was_training)
    return size


class ConvNet(nn.Module):
    """LeNet/VGG-like: two conv-BN-ReLU-maxpool stages, flattened into a linear layer."""

    def __init__(self, image_shape: tuple[int, int, int], latent_dim: int, widths: tuple[int, int] = (16, 32)):
        super().__init__()
        channels = image_shape[0]
        stages = []
        for width in widths:
            stages += [*_conv_bn_relu(channels, width, nhwc=not stages), nn.MaxPool2d(2, ceil_mode=True)]
            channels = width
        self.features = nn.Sequential(*stages, nn.Flatten())
        self.fc = nn.Linear(_flattened_size(self.features, image_shape), latent_dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.fc(self.features(images))


class BasicBlock(nn.Module):
    """Two 3×3 convolutions plus a skip connection (a 1×1 projection where the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


def _stem_stride(image_shape: tuple[int, int, int]) -> int:
    """Halve 28/32 px images in the stem, where full-resolution layers would cost most of the
    compute; 8×8 images keep their few pixels."""
    return 2 if min(image_shape[1:]) >= 16 else 1


class TinyResNet(nn.Module):
    """A stem convolution, three basic residual blocks (two strided, one identity skip), global
    average pooling."""

    def __init__(self, image_shape: tuple[int, int, int], latent_dim: int):
        super().__init__()
        self.stem = _conv_bn_relu(image_shape[0], 16, stride=_stem_stride(image_shape), nhwc=True)
        self.blocks = nn.Sequential(BasicBlock(16, 32, stride=2), BasicBlock(32, 32), BasicBlock(32, 64, stride=2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, latent_dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.fc(self.pool(self.blocks(self.stem(images))).flatten(1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand (1×1), depthwise 3×3, linear projection (1×1); a skip
    connection when the shape is kept."""

    def __init__(self, in_channels: int, out_channels: int, *, stride: int = 1, expansion: int = 4):
        super().__init__()
        hidden = in_channels * expansion
        self.use_skip = stride == 1 and in_channels == out_channels
        self.layers = nn.Sequential(
            *_pointwise(in_channels, hidden),
            *_depthwise(hidden, stride=stride),
            nn.Conv2d(hidden, out_channels, 1, bias=False),
            nn.BatchNorm2d(out_channels),  # no activation: ReLU on the narrow output loses information
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.layers(x)
        return x + out if self.use_skip else out


# ReLU rather than MobileNet's ReLU6: the cap matters for low-precision inference, not here, and
# ReLU6's backward runs about twice as slow on CPU.
def _depthwise(channels: int, *, stride: int = 1) -> list[nn.Module]:
    """A 3×3 convolution per channel (groups = channels)."""
    conv = nn.Conv2d(channels, channels, 3, stride=stride, padding=1, groups=channels, bias=False)
    return [conv, nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]


def _pointwise(in_channels: int, out_channels: int) -> list[nn.Module]:
    """A 1×1 convolution: mixes channels, pixel by pixel."""
    return [nn.Conv2d(in_channels, out_channels, 1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)]


class TinyMobileNet(nn.Module):
    """Depthwise-separable convolutions: a stem, one separable convolution (depthwise 3×3 then
    pointwise 1×1), three inverted residual blocks, global average pooling."""

    def __init__(self, image_shape: tuple[int, int, int], latent_dim: int):
        super().__init__()
        self.features = nn.Sequential(
            *_conv_bn_relu(image_shape[0], 16, stride=_stem_stride(image_shape), nhwc=True),
            *_depthwise(16),
            *_pointwise(16, 16),
            InvertedResidual(16, 24, stride=2, expansion=3),  # narrower: it expands at full resolution
            InvertedResidual(24, 24),
            InvertedResidual(24, 48, stride=2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(48, latent_dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.fc(self.features(images))


class MLP(nn.Module):
    """No convolutions: the flattened image through two hidden Linear-BN-ReLU layers."""

    def __init__(self, image_shape: tuple[int, int, int], latent_dim: int, hidden: int = 256):
        super().__init__()
        inputs = image_shape[0] * image_shape[1] * image_shape[2]
        self.layers = nn.Sequential(
            nn.Flatten(),
            nn.Linear(inputs, hidden, bias=False),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden, bias=False),
            nn.BatchNorm1d(hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, latent_dim),
        )

    def forward(self, images: Tensor) -> Tensor:
        return self.layers(images)


# --- GPU family: torchvision architectures adapted to small images ------------------------


def _torchvision_models():
    """Imported on first use: torchvision costs a daemon about 2.6 s of CPU at start, which a
    node on a CPU backbone does not need."""
    from ..torchvision_compat import torchvision

    return torchvision.models


def _resnet18(image_shape: tuple[int, int, int], latent_dim: int) -> nn.Module:
    # The CIFAR adaptation of the ResNet paper: a 3×3 stride-1 stem and no max pooling, so a
    # 32 px image reaches the last stage at 4×4 instead of 1×1.
    model = _torchvision_models().resnet18(weights=None)
    model.conv1 = nn.Conv2d(image_shape[0], 64, 3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision's
    model.maxpool = nn.Identity()
    model.fc = nn.Linear(model.fc.in_features, latent_dim)
    return model


def _shufflenet(image_shape: tuple[int, int, int], latent_dim: int) -> nn.Module:
    # Same adaptation: the stem convolution loses its stride and the max pooling goes.
    model = _torchvision_models().shufflenet_v2_x1_0(weights=None)
    stem = model.conv1[0]
    model.conv1[0] = nn.Conv2d(image_shape[0], stem.out_channels, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    model.fc = nn.Linear(model.fc.in_features, latent_dim)
    return model


def _googlenet(image_shape: tuple[int, int, int], latent_dim: int) -> nn.Module:
    # Five stride-2 reductions: even at 64 px the last inception stage works on 2×2.
    model = _torchvision_models().googlenet(weights=None, aux_logits=False, init_weights=True)
    stem = model.conv1.conv
    model.conv1.conv = nn.Conv2d(
        image_shape[0], stem.out_channels, stem.kernel_size, stride=stem.stride, padding=stem.padding, bias=False
    )
    model.fc = nn.Linear(model.fc.in_features, latent_dim)
    return _upsampled(model, image_shape)


def _alexnet(image_shape: tuple[int, int, int], latent_dim: int) -> nn.Module:
    # An 11×11 stride-4 stem and three max poolings: 64 px leaves 1×1 before the adaptive
    # pooling, which AlexNet's own 6×6 adaptive pooling then spreads out.
    model = _torchvision_models().alexnet(weights=None)
    stem = model.features[0]
    model.features[0] = nn.Conv2d(
        image_shape[0], stem.out_channels, stem.kernel_size, stride=stem.stride, padding=stem.padding
    )
    model.classifier[-1] = nn.Linear(model.classifier[-1].in_features, latent_dim)
    return _upsampled(model, image_shape)


def _upsampled(model: nn.Module, image_shape: tuple[int, int, int]) -> nn.Module:
    """`model` behind a bilinear upsampling to `UPSAMPLED_SIDE`, for images smaller than that."""
    if min(image_shape[1:]) >= UPSAMPLED_SIDE:
        return model
    upsample = nn.Upsample(size=(UPSAMPLED_SIDE, UPSAMPLED_SIDE), mode="bilinear", align_corners=False)
    return nn.Sequential(upsample, model)


_BUILDERS: dict[str, Callable[[tuple[int, int, int], int], nn.Module]] = {
    "convnet": ConvNet,
    "resnet": TinyResNet,
    "mobilenet": TinyMobileNet,
    "mlp": MLP,
    "resnet18": _resnet18,
    "shufflenet": _shufflenet,
    "googlenet": _googlenet,
    "alexnet": _alexnet,
}


def make_backbone(name: str, image_shape: Sequence[int], latent_dim: int, files: BackboneFiles = NO_FILES) -> nn.Module:
    """A freshly initialised backbone mapping N×C×H×W images to N×`latent_dim` (no activation
    on the output), from `files.weights` where given. Initialisation draws from torch's global
    RNG. Raises BackboneError if the user's backbone or weights do not fit."""
    spec = ModelSpec(name, tuple(image_shape), num_classes=1, latent_dim=latent_dim)  # validates
    if is_user_backbone(spec.backbone):
        body = user_module(spec.backbone, files.code)
        if files.weights is not None:
            load_weights(body, files.weights)
        return UserBackbone(body, spec.image_shape, spec.latent_dim)
    backbone = _BUILDERS[spec.backbone](spec.image_shape, spec.latent_dim)
    if files.weights is not None:
        load_weights(backbone, files.weights)
    return backbone


# --- The personal model -------------------------------------------------------------------


class ModelOutput(NamedTuple):
    latent: Tensor  # N × latent_dim
    projection: Tensor  # N × projection_dim, not normalised: the losses normalise
    logits: Tensor  # N × num_classes, no activation


class PersonalModel(nn.Module):
    """A peer's model, as in MAPL: backbone → latent z; a linear head on z gives the logits; a
    projector on z feeds the contrastive loss; `prototypes` holds one learnable point per class
    in the projection space."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.backbone = make_backbone(spec.backbone, spec.image_shape, spec.latent_dim, spec.files)
        # Exchanged between peers, so a plain Linear whose logits no activation follows.
        self.head = nn.Linear(spec.latent_dim, spec.num_classes)
        self.projector = nn.Sequential(
            nn.Linear(spec.latent_dim, spec.latent_dim),
            nn.BatchNorm1d(spec.latent_dim),
            nn.ReLU(inplace=True),
            nn.Linear(spec.latent_dim, spec.projection_dim),
        )
        self.prototypes = nn.Parameter(torch.empty(spec.num_classes, spec.projection_dim))
        self.reset_prototypes()

    def reset_prototypes(self, generator: torch.Generator | None = None) -> None:
        """Random unit prototypes, drawn from `generator` (None: torch's global one)."""
        with torch.no_grad():
            drawn = torch.randn(self.prototypes.shape, generator=generator)
            self.prototypes.copy_(F.normalize(drawn, dim=1))

    def forward(self, images: Tensor) -> ModelOutput:
        latent = self.backbone(images)
        return ModelOutput(latent, self.projector(latent), self.head(latent))

    def latent(self, images: Tensor) -> Tensor:
        return self.backbone(images)

    def classify(self, images: Tensor) -> Tensor:
        """Logits only: what evaluation needs, without running the projector."""
        return self.head(self.backbone(images))


def make_model(spec: ModelSpec) -> PersonalModel:
    return PersonalModel(spec)


class SmallModel(nn.Module):
    """The small homogeneous model that every node of a dual algorithm also trains and shares
    (MAPL-Dual's S, FedMRL's G): two conv-BN-ReLU-maxpool stages, pooled to 3×3 whatever the
    image size, a linear layer to `latent_dim`, and a linear head. About 25 k parameters on
    28×28 images, a fifth of the convnet backbone: it is what travels every round."""

    POOLED_SIDE = 3

    def __init__(self, image_shape: tuple[int, int, int], num_classes: int, latent_dim: int = 64):
        super().__init__()
        side = self.POOLED_SIDE
        self.backbone = nn.Sequential(
            *_conv_bn_relu(image_shape[0], 16, nhwc=True),
            nn.MaxPool2d(2, ceil_mode=True),
            *_conv_bn_relu(16, 32),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.AdaptiveAvgPool2d(side),
            nn.Flatten(),
            nn.Linear(32 * side * side, latent_dim),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(latent_dim, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))

    def classify(self, images: Tensor) -> Tensor:
        return self(images)


def parameter_count(module: nn.Module) -> int:
    """Number of scalar parameters (trainable or not) in `module`."""
    return sum(parameter.numel() for parameter in module.parameters())
