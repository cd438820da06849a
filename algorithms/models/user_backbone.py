"""A backbone of the user's own, and weights to start from (issue #45).

`[model].backbone = "module:callable"` names a function (or class) that takes no arguments and
returns an `nn.Module` mapping an image batch N×C×H×W to features: a torchvision model with its
classifier replaced by `nn.Identity()`, say. The module is imported from `[model].code` (a
folder; default the config file's), then from the Python path. Its features are flattened and
brought to the latent size every backbone here has by a linear layer of ours (`UserBackbone`),
so heads and prototypes still compare across peers; the feature size is read from the module,
by one forward pass of a zero batch in eval mode.

`[model].weights` is a state dict (`torch.save(module.state_dict(), PATH)`) loaded into the
backbone before training, for a user backbone into the module their callable returns: e.g. a
pretrained torchvision model saved on the device, as nothing is downloaded at run time. It is
loaded with `weights_only=True` (no code in it runs), and every tensor must match: a name missing
on either side or a shape that differs is an error naming the first ones.

A peer never sends a backbone: this code is the device owner's, named in their own config.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..catalog import USER_BACKBONE_PATTERN

__all__ = [
    "BackboneError",
    "BackboneFiles",
    "NO_FILES",
    "UserBackbone",
    "is_user_backbone",
    "load_weights",
    "user_builder",
    "user_module",
]

USER_BACKBONE = re.compile(USER_BACKBONE_PATTERN)
SHOWN = 3  # tensor names an error lists before it counts the rest


class BackboneError(ValueError):
    """The user's backbone or weights cannot be used; the message says which and why."""


@dataclass(frozen=True)
class BackboneFiles:
    """Where a node's backbone comes from beyond its name: `[model].code` and `[model].weights`."""

    code: Path | None = None  # the folder a "module:callable" backbone is imported from first
    weights: Path | None = None  # a state dict the backbone starts from


NO_FILES = BackboneFiles()  # a built-in backbone, freshly initialised


def is_user_backbone(name: str) -> bool:
    return USER_BACKBONE.fullmatch(name) is not None


def user_module(reference: str, code: Path | None) -> nn.Module:
    """The module `reference` ("module:callable") builds, imported from `code` first."""
    built = user_builder(reference, code)()
    if not isinstance(built, nn.Module):
        raise BackboneError(f"backbone {reference!r}: returned {type(built).__name__}, not a torch.nn.Module")
    return built


def user_builder(reference: str, code: Path | None) -> Callable[[], object]:
    """The callable `reference` ("module:callable") names, its module imported from `code` first."""
    from .. import torchvision_compat  # noqa: F401  (a user's `import torchvision` works on CPU-only torch)

    module_name, _, attribute = reference.partition(":")
    if code is not None and str(code) not in sys.path:
        sys.path.insert(0, str(code))  # kept: the module may import its neighbours later
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = f"{code} or the Python path" if code is not None else "the Python path"
        raise BackboneError(f"backbone {reference!r}: cannot import {module_name!r} from {where} ({exc})") from None
    build = getattr(module, attribute, None)
    if not callable(build):
        raise BackboneError(f"backbone {reference!r}: {module_name} has no callable {attribute!r}")
    return build


class UserBackbone(nn.Module):
    """The user's module, its features flattened and mapped to `latent_dim` by a linear layer."""

    def __init__(self, body: nn.Module, image_shape: tuple[int, int, int], latent_dim: int) -> None:
        super().__init__()
        self.body = body
        self.adapter = nn.Linear(feature_size(body, image_shape), latent_dim)

    def forward(self, images: Tensor) -> Tensor:
        return self.adapter(torch.flatten(self.body(images), 1))


def feature_size(body: nn.Module, image_shape: tuple[int, int, int]) -> int:
    """Features per image `body` gives for images of `image_shape` (a forward pass in eval mode)."""
    training = body.training
    body.eval()
    try:
        with torch.no_grad():
            out = body(torch.zeros(2, *image_shape))
    except Exception as exc:  # a user's module fails in as many ways as it has layers
        raise BackboneError(
            f"the backbone cannot take images of {'×'.join(map(str, image_shape))} ({type(exc).__name__}: {exc})"
        ) from None
    finally:
        body.train(training)
    if not isinstance(out, Tensor) or out.ndim < 2 or out.shape[0] != 2:
        raise BackboneError("the backbone must return one tensor of features per image (N × ...)")
    return out[0].numel()


def load_weights(module: nn.Module, path: Path) -> None:
    """Load the state dict at `path` into `module`; every tensor must match."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a missing file, a pickle with code in it, a truncated archive
        raise BackboneError(f"weights {path}: not a state dict torch loads ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
        raise BackboneError(f"weights {path}: expected a state dict (names to tensors): torch.save(m.state_dict())")
    own = module.state_dict()
    reshaped = [
        f"{name} {tuple(state[name].shape)} ≠ {tuple(tensor.shape)}"
        for name, tensor in own.items()
        if name in state and state[name].shape != tensor.shape
    ]
    problems = [
        *_listed("not in the file", [name for name in own if name not in state]),
        *_listed("not in the backbone", [name for name in state if name not in own]),
        *_listed("of another shape", reshaped),
    ]
    if problems:
        raise BackboneError(f"weights {path} do not fit the backbone: {'; '.join(problems)}")
    module.load_state_dict(state)


def _listed(what: str, names: list[str]) -> list[str]:
    if not names:
        return []
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return [f"{len(names)} {what} ({', '.join(names[:SHOWN])}{more})"]
