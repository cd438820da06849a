"""`import torchvision` on CPU-only torch, when torchvision's compiled extension cannot load.

Why: the PyPI torchvision 0.28.0 wheel is a CUDA build. On the CPU build of torch 2.13.0 its
extension (`torchvision/_C.so`) fails to load, which torchvision tolerates, but its
`_meta_registrations` module then registers fake kernels for `torchvision::nms` and
`torchvision::qnms`; with no such operators defined, `import torchvision` dies with
"operator torchvision::nms does not exist".

Fix: define those two operator schemas (no kernels) before the import, and only when the
extension really fails to load, so a working install (a GPU machine) is left untouched. Models,
transforms and datasets are pure Python and work; compiled ops (nms, roi_align, image decoding)
still raise torchvision's own "Couldn't load custom C++ ops" error if called.

Use `from algorithms.torchvision_compat import torchvision` instead of `import torchvision`.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import torch

__all__ = ["torchvision", "EXTENSION_LOADED"]

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_definitions: torch.library.Library | None = None  # must stay referenced, or torch drops the ops


def _extension_loads() -> bool:
    """Load torchvision's `_C` extension the way torchvision does; False if it cannot load."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return True  # not installed: let the real import raise its ImportError
    folder = os.path.dirname(spec.origin)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_C" + suffix)
        if os.path.exists(path):
            try:
                torch.ops.load_library(path)
            except OSError:
                return False
            return True
    return False


def _import_torchvision():
    global _definitions
    if "torchvision" not in sys.modules and not _extension_loads():
        _definitions = torch.library.Library("torchvision", "DEF")
        for schema in _SCHEMAS:
            _definitions.define(schema)
    import torchvision

    return torchvision


torchvision = _import_torchvision()
EXTENSION_LOADED: bool = torchvision.extension._has_ops()
