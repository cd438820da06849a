"""Backbones, the personal model (head, projector, prototypes) and batch augmentation."""

import math

import pytest
import torch
from torch import nn

from algorithms.data.augment import AugmentSpec, augment, default_augment, two_views
from algorithms.models.personal import (
    BACKBONES,
    CPU_BACKBONES,
    GPU_BACKBONES,
    ModelError,
    ModelOutput,
    ModelSpec,
    PersonalModel,
    make_backbone,
    make_model,
    parameter_count,
)

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
BATCH = 4


def model(backbone="convnet", image_shape=(1, 28, 28), num_classes=10, seed=0, **dims) -> PersonalModel:
    torch.manual_seed(seed)
    return make_model(ModelSpec(backbone, image_shape, num_classes, **dims))


def test_backbone_lists():
    assert set(CPU_BACKBONES) >= {"convnet", "resnet", "mobilenet", "mlp"}
    assert GPU_BACKBONES == ("resnet18", "shufflenet", "googlenet", "alexnet")
    assert BACKBONES == CPU_BACKBONES + GPU_BACKBONES


@pytest.mark.parametrize("image_shape", SHAPES)
@pytest.mark.parametrize("backbone", CPU_BACKBONES)
def test_cpu_backbone_shapes_and_gradients(backbone, image_shape):
    net = model(backbone, image_shape, num_classes=7, latent_dim=32, projection_dim=16)
    images = torch.randn(BATCH, *image_shape)
    assert make_backbone(backbone, image_shape, 32)(images).shape == (BATCH, 32)

    out = net(images)
    assert isinstance(out, ModelOutput)
    assert out.latent.shape == (BATCH, 32)
    assert out.projection.shape == (BATCH, 16)
    assert out.logits.shape == (BATCH, 7)
    assert torch.allclose(net.latent(images), out.latent, atol=1e-6)

    (out.logits.sum() + out.projection.pow(2).sum()).backward()
    for part in (net.backbone, net.head, net.projector):
        grads = [p.grad for p in part.parameters()]
        assert grads and all(g is not None for g in grads), part
        assert any(g.abs().sum() > 0 for g in grads), part
    assert isinstance(net.prototypes, nn.Parameter) and net.prototypes.requires_grad
    assert net.prototypes.shape == (7, 16)


@pytest.mark.parametrize("backbone", CPU_BACKBONES)
def test_eval_mode_is_deterministic_and_classify_matches_forward(backbone):
    net = model(backbone).eval()
    images = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        out = net(images)
        assert torch.equal(net.latent(images), out.latent)
        assert torch.equal(net.classify(images), out.logits)
        # Eval mode uses running statistics: one image alone gives the same answer as in a batch.
        assert torch.allclose(net.classify(images[:1]), out.logits[:1], atol=1e-5)


def module_types(backbone: str) -> set[type]:
    return {type(m) for m in make_backbone(backbone, (1, 28, 28), 128).modules()}


def test_cpu_backbones_are_architecturally_different():
    convs = {
        name: [m for m in make_backbone(name, (1, 28, 28), 128).modules() if isinstance(m, nn.Conv2d)]
        for name in CPU_BACKBONES
    }
    assert [name for name in CPU_BACKBONES if not convs[name]] == ["mlp"]
    assert [name for name in CPU_BACKBONES if any(c.groups > 1 for c in convs[name])] == ["mobilenet"]
    pooled = [name for name in CPU_BACKBONES if nn.MaxPool2d in module_types(name)]
    assert pooled == ["convnet"]
    residual = [name for name in CPU_BACKBONES if any(t.__name__ == "BasicBlock" for t in module_types(name))]
    assert residual == ["resnet"]
    inverted = [name for name in CPU_BACKBONES if any(t.__name__ == "InvertedResidual" for t in module_types(name))]
    assert inverted == ["mobilenet"]
    types = [frozenset(module_types(name)) for name in CPU_BACKBONES]
    assert len(set(types)) == len(CPU_BACKBONES)
    counts = [parameter_count(make_backbone(name, (1, 28, 28), 128)) for name in CPU_BACKBONES]
    assert len(set(counts)) == len(counts)


def test_residual_blocks_add_their_input():
    from algorithms.models.personal import BasicBlock, InvertedResidual

    block = BasicBlock(8, 8).eval()
    for layer in (block.conv2,):
        nn.init.zeros_(layer.weight)  # the residual branch now outputs BN's bias, zero
    x = torch.rand(2, 8, 5, 5)
    assert torch.allclose(block(x), x)  # relu(0 + x) for x ≥ 0
    inverted = InvertedResidual(8, 8).eval()
    nn.init.zeros_(inverted.layers[-2].weight)
    assert torch.allclose(inverted(x), x)
    assert not InvertedResidual(8, 16).use_skip and not InvertedResidual(8, 8, stride=2).use_skip


@pytest.mark.parametrize("backbone", CPU_BACKBONES)
def test_same_seed_same_parameters_other_seed_other_parameters(backbone):
    first, again, other = model(backbone, seed=1), model(backbone, seed=1), model(backbone, seed=2)
    a, b, c = first.state_dict(), again.state_dict(), other.state_dict()
    assert list(a) == list(b) == list(c)
    assert all(torch.equal(a[name], b[name]) for name in a)
    # Parameters travel between peers as plain arrays: none may be in an odd memory layout.
    assert all(tensor.is_contiguous() for tensor in a.values())
    assert not all(torch.equal(a[name], c[name]) for name in a)
    assert not torch.equal(first.prototypes, other.prototypes)


def test_prototypes_start_as_unit_rows():
    net = model(num_classes=10, projection_dim=24)
    assert net.prototypes.shape == (10, 24)
    assert torch.allclose(net.prototypes.norm(dim=1), torch.ones(10), atol=1e-6)


@pytest.mark.parametrize("backbone", CPU_BACKBONES)
def test_head_is_the_last_layer_and_logits_are_raw(backbone):
    net = model(backbone, num_classes=5)
    assert type(net.head) is nn.Linear and net.head.in_features == 128 and net.head.out_features == 5
    images = torch.randn(32, 1, 28, 28)
    out = net(images)
    assert torch.allclose(out.logits, net.head(out.latent))
    assert (out.logits < 0).any() and (out.logits > 0).any()
    # The projector of the MAPL paper, and no normalisation of its output.
    assert [type(m) for m in net.projector] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert not torch.allclose(out.projection.norm(dim=1), torch.ones(32))


def test_latent_dim_is_shared_across_backbones():
    images = torch.randn(2, 3, 32, 32)
    for backbone in CPU_BACKBONES:
        assert model(backbone, (3, 32, 32), latent_dim=64).latent(images).shape == (2, 64)


@pytest.mark.parametrize(
    "arguments",
    [
        ("vgg", (1, 28, 28), 10),
        ("", (1, 28, 28), 10),
        ("convnet", (28, 28), 10),
        ("convnet", (1, 28, 28, 1), 10),
        ("convnet", (1, 0, 28), 10),
        ("convnet", (1, 28.0, 28), 10),
        ("convnet", "1x28x28", 10),
        ("convnet", (1, 28, 28), 0),
        ("convnet", (1, 28, 28), True),
    ],
)
def test_bad_spec_is_refused(arguments):
    with pytest.raises(ModelError):
        ModelSpec(*arguments)


def test_bad_dims_and_unknown_backbone_messages():
    with pytest.raises(ModelError, match="latent_dim"):
        ModelSpec("mlp", (1, 8, 8), 10, latent_dim=0)
    with pytest.raises(ModelError, match="projection_dim"):
        ModelSpec("mlp", (1, 8, 8), 10, projection_dim=-1)
    with pytest.raises(ModelError, match="convnet, resnet, mobilenet, mlp"):
        ModelSpec("lenet", (1, 8, 8), 10)
    with pytest.raises(ModelError):
        make_backbone("lenet", (1, 8, 8), 16)
    assert issubclass(ModelError, ValueError)


def test_spec_takes_a_list_shape_and_is_hashable():
    spec = ModelSpec("mlp", [1, 8, 8], 10)
    assert spec.image_shape == (1, 8, 8)
    assert hash(spec) == hash(ModelSpec("mlp", (1, 8, 8), 10))
    assert make_model(spec).spec == spec


def test_parameter_count():
    assert parameter_count(nn.Linear(3, 4)) == 16
    net = model("mlp", (1, 8, 8), num_classes=10, latent_dim=32, projection_dim=16)
    parts = net.backbone, net.head, net.projector
    assert parameter_count(net) == sum(parameter_count(p) for p in parts) + 10 * 16


@pytest.mark.parametrize("image_shape", [(1, 28, 28), (3, 32, 32)])
@pytest.mark.parametrize("backbone", GPU_BACKBONES)
def test_torchvision_backbones_run_on_small_images(backbone, image_shape):
    torch.manual_seed(0)
    net = make_backbone(backbone, image_shape, 48).eval()
    with torch.no_grad():
        latent = net(torch.randn(2, *image_shape))
    assert latent.shape == (2, 48) and torch.isfinite(latent).all()


def test_torchvision_personal_model_trains_one_step():
    """Every backbone parameter gets a gradient, and one SGD step lowers the loss on its batch."""
    torch.manual_seed(0)
    net = model("shufflenet", (3, 32, 32), num_classes=4)
    images, labels = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3] * 2)
    before = [p.detach().clone() for p in net.parameters()]
    loss = torch.nn.functional.cross_entropy(net(images).logits, labels)
    loss.backward()
    assert all(p.grad is not None for p in net.backbone.parameters())
    torch.optim.SGD(net.parameters(), lr=0.05).step()
    assert all(
        not torch.equal(old, p)
        for old, p in zip(before, net.parameters(), strict=True)
        if p.grad is not None and p.grad.any()
    )
    assert torch.nn.functional.cross_entropy(net(images).logits, labels) < loss


# --- augmentation -------------------------------------------------------------------------


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


IDENTITY = AugmentSpec(max_shift=0.0, max_rotation_deg=0.0, scale=(1.0, 1.0), noise_std=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("image_shape", [*SHAPES, (3, 20, 30)])
def test_augment_keeps_shape_and_dtype(image_shape, dtype):
    images = torch.rand(5, *image_shape, dtype=dtype)
    spec = AugmentSpec(noise_std=0.1, horizontal_flip=True)
    out = augment(images, spec, generator(0))
    assert out.shape == images.shape and out.dtype == dtype and torch.isfinite(out).all()


def test_augment_is_deterministic_under_a_generator_and_ignores_the_global_rng():
    images = torch.rand(8, 1, 28, 28)
    spec = AugmentSpec(noise_std=0.05, horizontal_flip=True)
    torch.manual_seed(1)
    first = two_views(images, spec, generator(42))
    torch.manual_seed(2)
    again = two_views(images, spec, generator(42))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(augment(images, spec, generator(43)), first[0])


def test_two_views_differ_from_each_other_and_the_input():
    images = torch.rand(8, 3, 32, 32)
    one, two = two_views(images, default_augment((3, 32, 32)), generator(0))
    for view in (one, two):
        assert view.shape == images.shape
        assert not torch.allclose(view, images, atol=1e-3)
    # Each image's two views differ: the transforms are drawn per image and per view.
    per_image = (one - two).abs().flatten(1).mean(1)
    assert (per_image > 1e-3).all()


def test_identity_spec_returns_the_input():
    images = torch.randn(6, 3, 32, 32)
    assert torch.allclose(augment(images, IDENTITY, generator(0)), images, atol=1e-5)
    one, two = two_views(images[:, :1], IDENTITY, generator(0))
    assert torch.allclose(one, images[:, :1], atol=1e-5) and torch.allclose(two, images[:, :1], atol=1e-5)


def test_shift_moves_content_at_most_max_shift():
    # Shifts of up to one pixel, no rotation or zoom: the bright pixel moves to a neighbour at most.
    image = torch.zeros(1, 1, 8, 8)
    image[0, 0, 3, 4] = 1.0
    spec = AugmentSpec(max_shift=1 / 8, max_rotation_deg=0.0, scale=(1.0, 1.0))
    outputs = [augment(image, spec, generator(seed)) for seed in range(50)]
    # Bilinear: the mass of the bright pixel is kept wherever it lands inside the image.
    assert all(math.isclose(out.sum().item(), 1.0, abs_tol=1e-5) for out in outputs)
    peaks = {tuple(divmod(int(out.argmax()), 8)) for out in outputs}
    assert len(peaks) > 1 and all(abs(r - 3) <= 1 and abs(c - 4) <= 1 for r, c in peaks)


def test_horizontal_flip_mirrors():
    images = torch.rand(64, 1, 6, 6)
    spec = AugmentSpec(max_shift=0.0, max_rotation_deg=0.0, scale=(1.0, 1.0), horizontal_flip=True)
    out = augment(images, spec, generator(3))
    flipped = [torch.allclose(o, i.flip(-1), atol=1e-5) for o, i in zip(out, images, strict=True)]
    kept = [torch.allclose(o, i, atol=1e-5) for o, i in zip(out, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 10 < sum(flipped) < 54


def test_rotation_by_a_quarter_turn():
    image = torch.arange(16.0).reshape(1, 1, 4, 4)
    spec = AugmentSpec(max_shift=0.0, max_rotation_deg=90.0, scale=(1.0, 1.0))
    turned = augment(image.expand(200, 1, 4, 4).contiguous(), spec, generator(0))
    # Angles are continuous: some come close to ±90°, which is rot90 one way or the other.
    quarter = [torch.rot90(image[0], k, dims=(1, 2)) for k in (1, -1)]
    assert any(any(torch.allclose(t, q, atol=0.5) for q in quarter) for t in turned)


def test_augment_refuses_integer_images_and_bad_specs():
    with pytest.raises(ValueError):
        augment(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), AugmentSpec(), generator(0))
    with pytest.raises(ValueError):
        augment(torch.zeros(1, 8, 8), AugmentSpec(), generator(0))
    with pytest.raises(ValueError):
        AugmentSpec(scale=(1.1, 0.9))
    with pytest.raises(ValueError):
        AugmentSpec(max_shift=-0.1)


def test_default_augment_by_image_shape():
    digits, mnist, cifar = (default_augment(shape) for shape in SHAPES)
    assert not digits.horizontal_flip and not mnist.horizontal_flip and cifar.horizontal_flip
    assert digits.max_shift * 8 <= 0.5 and mnist.max_shift * 28 >= 3


def test_evaluation_statistics_are_those_of_the_current_weights_on_the_training_images():
    """statistics.refresh_statistics: every BatchNorm layer the predictors run through ends with
    the mean and variance of what it sees on the training images under the current weights (the
    running averages of training trail them), whatever it held before; again, the same; a layer
    they do not run (the projector) and the momentum keep theirs; one image changes nothing."""
    from algorithms.models.statistics import refresh_statistics
    from algorithms.models.training import ModelPredictor

    net = model("convnet", (1, 8, 8), 4)
    predictors, images = ModelPredictor(net), torch.rand(6, 1, 8, 8)
    first = net.backbone.features[2]  # the first convolution's BatchNorm (after ChannelsLast)
    assert isinstance(first, nn.BatchNorm2d)
    unused = next(m for m in net.projector.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    projector_before = unused.running_mean.clone()
    first.running_mean.fill_(5.0)  # stale, as after many rounds of mixing
    with torch.no_grad():
        seen = net.backbone.features[0](images)
    net.eval()
    refresh_statistics(predictors.all, net, images[:1])
    assert torch.all(first.running_mean == 5.0)  # a batch of one has no variance
    refresh_statistics(predictors.all, net, images)
    assert not net.training and first.momentum == 0.1
    torch.testing.assert_close(first.running_mean, seen.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(first.running_var, seen.var(dim=(0, 2, 3), unbiased=True))
    again = {name: tensor.clone() for name, tensor in net.state_dict().items()}
    refresh_statistics(predictors.all, net, images)
    assert all(torch.equal(tensor, again[name]) for name, tensor in net.state_dict().items())
    assert torch.equal(unused.running_mean, projector_before)
