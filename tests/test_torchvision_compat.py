"""torchvision's pure-Python parts work on CPU torch even when its C++ extension cannot load."""

import subprocess
import sys

import pytest
import torch

from algorithms.torchvision_compat import EXTENSION_LOADED, torchvision


def test_models_build_and_run_forward():
    torch.manual_seed(0)
    for model, size in (
        (torchvision.models.resnet18(num_classes=10), 32),
        (torchvision.models.shufflenet_v2_x0_5(num_classes=10), 32),
    ):
        model.eval()
        with torch.no_grad():
            logits = model(torch.randn(2, 3, size, size))
        assert logits.shape == (2, 10) and torch.isfinite(logits).all()


def test_transforms_run_on_tensors():
    from torchvision.transforms import v2

    pipeline = v2.Compose(
        [
            v2.RandomResizedCrop(28, scale=(0.8, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.1307], std=[0.3081]),
        ]
    )
    image = torch.randint(0, 256, (1, 32, 32), dtype=torch.uint8)
    out = pipeline(image)
    assert out.shape == (1, 28, 28) and out.dtype == torch.float32


def test_compiled_ops_fail_loudly_only_without_the_extension():
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    scores = torch.tensor([0.9, 0.8])
    if EXTENSION_LOADED:
        assert torchvision.ops.nms(boxes, scores, 0.5).tolist() == [0]
    else:
        with pytest.raises(RuntimeError, match="Couldn't load custom C\\+\\+ ops"):
            torchvision.ops.nms(boxes, scores, 0.5)


def test_plain_import_needs_the_compat_module_exactly_when_the_extension_is_missing():
    result = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=120)
    if EXTENSION_LOADED:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and "torchvision::nms does not exist" in result.stderr
