"""A device's own data, read from local files: an image folder or a `.npz` of arrays.

Image folder (torchvision's ImageFolder layout): one sub-folder per class, named after the
class, holding that class's images at any depth (IMAGE_EXTENSIONS; other files, and files and
folders whose name starts with '.', are skipped). Each image is converted to grayscale
(`channels` 1) or RGB (3) and resized to `image_size` × `image_size` (the aspect ratio is not
kept), then scaled to [0, 1] like the bundled datasets (`datasets.py`).

`.npz` (`numpy.savez`): `x`, the images, N×H×W (one channel) or N×C×H×W with C = 1 or 3, as
uint8 (0..255) or floats in [0, 1]; `y`, N integer labels; optionally `x_test` and `y_test`,
the same way. No other keys; object arrays are refused (nothing is ever unpickled).

Class ids mean the same on every node because the network agrees on one list of class names:
a class's id is its position in that list. A class folder is named after its class; a `.npz`
label is the class id itself. Without a test part, `test_fraction` of each class is held out
(`held_out_count`), chosen with the seed.

A folder's images are read in the order of their paths within their class folders, classes
breaking ties: a folder written from an indexed dataset, one file per image named by its index,
reads back in the dataset's own order (so `own_dataset` partitions it as the dataset itself).

`own_dataset` is the whole of the data as a `Dataset`, which a partition deals out to nodes
(`p2pnode simulate --data`, `[data].dataset = "path"`); `load_own_data` is one device's data,
split into training and test images.

Two passes: `inspect_own_data` is what a config check runs (listing, image headers, array
headers, labels; about 60 µs a small PNG), `load_own_data` decodes every image and checks
every pixel value (about three times as long).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .datasets import ArrayDataset, Dataset, DatasetError, _pool, _scaled

__all__ = [
    "DEFAULT_CHANNELS",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_TEST_FRACTION",
    "IMAGE_EXTENSIONS",
    "NPZ_KEYS",
    "Inventory",
    "OwnDataError",
    "OwnDataSpec",
    "decode_image",
    "folder_class_names",
    "held_out_count",
    "held_out_split",
    "held_out_files",
    "inspect_own_data",
    "load_own_data",
    "own_dataset",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".pbm", ".tif", ".tiff", ".webp")
NPZ_KEYS = ("x", "y", "x_test", "y_test")
DEFAULT_IMAGE_SIZE = 28  # the side of mnist5k's images, which every backbone is tuned for
DEFAULT_CHANNELS = 1
DEFAULT_TEST_FRACTION = 0.2
DAMAGED_NAMED = 5  # unreadable images an error names before it counts the rest
# Every backbone works from 8 px (the `digits` set's side) up; a larger side only costs memory.
MIN_SIDE, MAX_SIDE = 8, 1024
_FLOAT32_BYTES = 4


class OwnDataError(DatasetError):
    """The node's own data cannot be used; `field` is the `[data]` setting to look at."""

    def __init__(self, message: str, field: str = "path") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class OwnDataSpec:
    path: Path
    class_names: tuple[str, ...]  # the network's classes; a class id is a position here
    image_size: int = DEFAULT_IMAGE_SIZE  # image folders only
    channels: int = DEFAULT_CHANNELS  # image folders only: 1 grayscale, 3 RGB
    test_fraction: float | None = None  # None: DEFAULT_TEST_FRACTION, unless the .npz has a test part
    max_memory_mb: int = 1024  # bound on the images as float32
    seed: int = 0  # of the held-out split
    node: int | None = None  # the device's number in its network, which seeds its model; None: its node id
    skip_damaged: bool = False  # image folders: skip an image that cannot be read or decoded, instead of failing

    @property
    def is_npz(self) -> bool:
        return self.path.suffix.lower() == ".npz"

    @property
    def name(self) -> str:
        """The data's name: its folder's or file's, without `.npz` (a partition's draws depend on it)."""
        return self.path.stem if self.is_npz else self.path.name


@dataclass(frozen=True)
class Inventory:
    """What a config check learns without decoding pixels."""

    image_shape: tuple[int, int, int]  # C, H, W, as the node's model will see it
    counts: tuple[int, ...]  # images per class id (a folder: before the held-out split)
    test_counts: tuple[int, ...] | None  # the .npz's own test part; None: held out of `counts`
    files: tuple[tuple[Path, int], ...] = ()  # an image folder's files and their class ids
    damaged: tuple[str, ...] = ()  # with `skip_damaged`: why each skipped file could not be read


def held_out_count(n: int, fraction: float) -> int:
    """Test images held out of a class of n: about `fraction` of them, at least one, and never
    the class's last training image (a class of one image stays in training)."""
    return 0 if n < 2 else min(n - 1, max(1, round(n * fraction)))


def held_out_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Training and test indices, stratified per class, chosen with `seed`."""
    rng = np.random.default_rng([seed, 0x6F776E])  # "own"
    train, test = [], []
    for k in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == k))
        cut = held_out_count(len(members), fraction)
        test.append(members[:cut])
        train.append(members[cut:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def inspect_own_data(spec: OwnDataSpec) -> Inventory:
    """Check the data's structure cheaply; raises OwnDataError saying what is wrong."""
    if not spec.path.exists():
        raise OwnDataError(f"{spec.path} does not exist")
    inventory = _inspect_npz(spec) if spec.is_npz else _inspect_folder(spec)
    present = [k for k, n in enumerate(inventory.counts) if n]
    if len(present) < 2:
        names = ", ".join(repr(spec.class_names[k]) for k in present) or "none"
        raise OwnDataError(f"{spec.path} holds images of {len(present)} class ({names}); a node needs at least 2")
    if inventory.test_counts is None and not any(n >= 2 for n in inventory.counts):
        raise OwnDataError(f"{spec.path}: no class has 2 images, so none can be held out for testing")
    return inventory


def load_own_data(spec: OwnDataSpec, damaged: list[str] | None = None) -> tuple[ArrayDataset, ArrayDataset]:
    """The node's training and test images (decoded, checked, split); raises OwnDataError.
    With `spec.skip_damaged`, why each skipped image could not be used is appended to `damaged`."""
    inventory = inspect_own_data(spec)
    if spec.is_npz:
        images, labels, test = _load_npz(spec)
        if test is not None:
            return _pool(images, labels), test
    else:
        images, labels = _load_folder(spec, inventory.files, skipped := list(inventory.damaged))
        if damaged is not None:
            damaged.extend(skipped)
    fraction = DEFAULT_TEST_FRACTION if spec.test_fraction is None else spec.test_fraction
    train_idx, test_idx = held_out_split(labels, fraction, spec.seed)
    return _pool(images[train_idx], labels[train_idx]), _pool(images[test_idx], labels[test_idx])


def held_out_files(spec: OwnDataSpec) -> list[tuple[str, int]]:
    """The images a node on `spec` holds out for testing, in its test split's order (that of its
    evaluation), with their class ids: a folder's files (absolute paths), a
    .npz's rows (`x[i]`, or `x_test[i]` where it has a test part). Decodes nothing; raises
    OwnDataError. An image skipped as damaged only when decoded (`skip_damaged`) shifts the
    split: compare the labels with the evaluation's before naming its images."""
    inventory = inspect_own_data(spec)
    if spec.is_npz:
        try:
            with np.load(spec.path, allow_pickle=False) as arrays:
                if "y_test" in arrays.files:
                    return [(f"x_test[{i}]", int(k)) for i, k in enumerate(arrays["y_test"])]
                names, labels = [f"x[{i}]" for i in range(len(arrays["y"]))], arrays["y"].astype(np.int64)
        except (OSError, ValueError, zipfile.BadZipFile) as error:
            raise OwnDataError(f"{spec.path} could not be read ({error})") from None
    else:
        names = [str(path.resolve()) for path, _ in inventory.files]
        labels = np.array([k for _, k in inventory.files], dtype=np.int64)
    fraction = DEFAULT_TEST_FRACTION if spec.test_fraction is None else spec.test_fraction
    _, test = held_out_split(labels, fraction, spec.seed)
    return [(names[i], int(labels[i])) for i in test]


def own_dataset(spec: OwnDataSpec) -> Dataset:
    """All of the data as one dataset named `spec.name`, for a partition to deal out: a folder
    and a .npz's x are its pool; a .npz's x_test, if any, its test pool. Nothing is held out
    (`test_fraction` and `seed` do not apply); raises OwnDataError."""
    inventory = inspect_own_data(spec)
    if spec.is_npz:
        images, labels, test = _load_npz(spec)
    else:
        (images, labels), test = _load_folder(spec, inventory.files, []), None
    return Dataset(spec.name, len(spec.class_names), inventory.image_shape, _pool(images, labels), test)


def folder_class_names(path: Path) -> tuple[str, ...]:
    """The classes an image folder names: its class folders' names, sorted. A .npz names none
    (its labels are class ids), so its class names must be given; raises OwnDataError."""
    if path.suffix.lower() == ".npz":
        raise OwnDataError(
            f"{path} is a .npz, whose labels are class ids: name its classes (one name per id)", field="class_names"
        )
    if not path.exists():
        raise OwnDataError(f"{path} does not exist")
    if not path.is_dir():
        raise OwnDataError(f"{path} is neither a folder of class folders nor a .npz file")
    return tuple(sorted(entry.name for entry in path.iterdir() if entry.is_dir() and not entry.name.startswith(".")))


def _memory_check(spec: OwnDataSpec, images: int, shape: tuple[int, ...]) -> None:
    needed = images * int(np.prod(shape)) * _FLOAT32_BYTES
    if needed > spec.max_memory_mb * 2**20:
        raise OwnDataError(
            f"{spec.path}: {images} images of {'×'.join(map(str, shape))} take {needed / 2**20:.0f} MB "
            f"as float32, more than [data].max_memory_mb ({spec.max_memory_mb})",
            field="max_memory_mb",
        )


# --- image folders ------------------------------------------------------------------------


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _inspect_folder(spec: OwnDataSpec) -> Inventory:
    root = spec.path
    if not root.is_dir():
        raise OwnDataError(f"{root} is neither a folder of class folders nor a .npz file")
    folders = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not folders:
        raise OwnDataError(f"{root} holds no class folders: put each class's images in a sub-folder named after it")
    ids = {name: k for k, name in enumerate(spec.class_names)}
    unknown = [folder.name for folder in folders if folder.name not in ids]
    if unknown:
        raise OwnDataError(
            f"class folders {unknown} of {root} are not in [data].class_names; a folder must be named "
            "after one of the network's classes"
        )
    shape = (spec.channels, spec.image_size, spec.image_size)
    counts = [0] * len(spec.class_names)
    files: list[tuple[Path, int]] = []
    damaged: list[str] = []
    for folder in folders:
        images = [
            path
            for path in sorted(folder.rglob("*"))
            if path.suffix.lower() in IMAGE_EXTENSIONS and not _hidden(path, folder) and path.is_file()
        ]
        if not images:
            raise OwnDataError(f"class folder {folder} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        _memory_check(spec, len(files) + len(images), shape)
        images = [path for path in images if _readable(path, damaged)]
        counts[ids[folder.name]] = len(images)
        files += [(path, ids[folder.name]) for path in images]
    if damaged and not spec.skip_damaged:
        more = f"; and {len(damaged) - DAMAGED_NAMED} more" if len(damaged) > DAMAGED_NAMED else ""
        raise OwnDataError(
            f"{len(damaged)} of its images cannot be read: {'; '.join(damaged[:DAMAGED_NAMED])}{more} "
            "([data].skip_damaged = true leaves them out)"
        )
    files.sort(key=lambda entry: _reading_order(entry[0], root))
    return Inventory(shape, tuple(counts), None, tuple(files), tuple(damaged))


def _readable(path: Path, damaged: list[str]) -> bool:
    """Whether the image's header reads; one that does not is noted in `damaged` (the load then
    fails naming them all, or with `[data].skip_damaged` leaves them out)."""
    try:
        _check_header(path)
    except OwnDataError as exc:
        damaged.append(str(exc))
        return False
    return True


def _reading_order(path: Path, root: Path) -> tuple[tuple[str, ...], str]:
    """By path within the class folder, then class (the module's docstring says why)."""
    parts = path.relative_to(root).parts
    return parts[1:], parts[0]


def _check_header(path: Path) -> None:
    """Open the image as far as its header: its format and size, no pixels."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.size  # noqa: B018 (read from the header)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise OwnDataError(f"{path} is not a readable image ({error})") from None


def decode_image(source: Path | BinaryIO, shape: tuple[int, int, int]) -> np.ndarray:
    """One image file as uint8 pixels C×H×W (`shape`): converted to grayscale (C 1) or RGB (3)
    and resized bilinearly to H×W, the aspect ratio not kept. Every image file a node reads,
    its own and those it is asked to classify, goes through here; raises OwnDataError if it
    cannot be decoded."""
    from PIL import Image

    channels, height, width = shape
    what = source if isinstance(source, (str, Path)) else "image"
    try:
        with Image.open(source) as image:
            converted = image.convert("L" if channels == 1 else "RGB").resize(
                (width, height), Image.Resampling.BILINEAR
            )
            return np.asarray(converted).reshape(height, width, channels).transpose(2, 0, 1)
    except Image.UnidentifiedImageError:
        raise OwnDataError(f"{what} could not be decoded (not an image format PIL reads)") from None
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise OwnDataError(f"{what} could not be decoded ({error})") from None


def _load_folder(
    spec: OwnDataSpec, files: tuple[tuple[Path, int], ...], damaged: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """The folder's images decoded; with `spec.skip_damaged` one that fails to decode is left
    out and why is appended to `damaged`."""
    side = spec.image_size
    pixels = np.empty((len(files), spec.channels, side, side), dtype=np.uint8)
    kept = np.ones(len(files), dtype=bool)
    for index, (path, _) in enumerate(files):
        try:
            pixels[index] = decode_image(path, (spec.channels, side, side))
        except OwnDataError as exc:
            if not spec.skip_damaged:
                raise
            damaged.append(str(exc))
            kept[index] = False
    labels = np.array([k for _, k in files], dtype=np.int64)
    return _scaled(pixels[kept], 255.0), labels[kept]


# --- .npz files ---------------------------------------------------------------------------


def _array_headers(spec: OwnDataSpec) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array of the .npz, read from the headers only."""
    try:
        with zipfile.ZipFile(spec.path) as archive:
            names = archive.namelist()
            odd = [name for name in names if not name.endswith(".npy") or name[:-4] not in NPZ_KEYS]
            if odd:
                raise OwnDataError(
                    f"{spec.path} holds {', '.join(odd)}; a .npz of own data holds only the arrays "
                    "x and y, and optionally x_test and y_test"
                )
            headers = {}
            for name in names:
                with archive.open(name) as member:
                    version = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0
                    if version == (2, 0):
                        read = np.lib.format.read_array_header_2_0
                    elif version != (1, 0):
                        raise ValueError(f"array format {version} of {name} is not supported; save with numpy.savez")
                    shape, _, dtype = read(member)
                headers[name[:-4]] = (shape, dtype)
            return headers
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise OwnDataError(f"{spec.path} is not a readable .npz file ({error})") from None


def _inspect_npz(spec: OwnDataSpec) -> Inventory:
    headers = _array_headers(spec)
    missing = [key for key in ("x", "y") if key not in headers]
    if ("x_test" in headers) != ("y_test" in headers):
        missing.append("y_test" if "x_test" in headers else "x_test")
    if missing:
        raise OwnDataError(f"{spec.path} lacks the array(s) {', '.join(missing)}")
    has_test = "x_test" in headers
    if has_test and spec.test_fraction is not None:
        raise OwnDataError(
            f"{spec.path} has its own test part (x_test, y_test); nothing is held out, remove test_fraction",
            field="test_fraction",
        )
    shape = _image_shape(spec, "x", *headers["x"])
    total = headers["x"][0][0]
    if has_test:
        if _image_shape(spec, "x_test", *headers["x_test"]) != shape:
            raise OwnDataError(f"{spec.path}: x_test's images are not shaped like x's ({'×'.join(map(str, shape))})")
        total += headers["x_test"][0][0]
    _memory_check(spec, total, shape)
    counts = _label_counts(spec, "y", headers, headers["x"][0][0])
    test_counts = _label_counts(spec, "y_test", headers, headers["x_test"][0][0]) if has_test else None
    if test_counts is not None and not sum(test_counts):
        raise OwnDataError(f"{spec.path}: x_test holds no images")
    return Inventory(shape, counts, test_counts)


def _image_shape(spec: OwnDataSpec, key: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, int, int]:
    if dtype.hasobject or not (dtype == np.uint8 or np.issubdtype(dtype, np.floating)):
        raise OwnDataError(f"{spec.path}: {key} is {dtype}; store images as uint8 (0..255) or floats in [0, 1]")
    if len(shape) == 3:
        shape = (shape[0], 1, *shape[1:])
    elif len(shape) != 4 or shape[1] not in (1, 3):
        hint = " (channels last? store x.transpose(0, 3, 1, 2))" if len(shape) == 4 and shape[3] in (1, 3) else ""
        raise OwnDataError(f"{spec.path}: {key} has shape {shape}; expected N×H×W or N×C×H×W with C 1 or 3{hint}")
    if not all(MIN_SIDE <= side <= MAX_SIDE for side in shape[2:]):
        raise OwnDataError(
            f"{spec.path}: {key}'s images are {shape[2]}×{shape[3]}; sides from {MIN_SIDE} to {MAX_SIDE}"
        )
    return shape[1], shape[2], shape[3]


def _label_counts(spec: OwnDataSpec, key: str, headers: dict, images: int) -> tuple[int, ...]:
    shape, dtype = headers[key]
    if not np.issubdtype(dtype, np.integer):
        raise OwnDataError(f"{spec.path}: {key} is {dtype}; labels are integer class ids")
    if shape != (images,):
        raise OwnDataError(f"{spec.path}: {key} has shape {shape}; expected ({images},), one label per image")
    try:
        with np.load(spec.path, allow_pickle=False) as arrays:
            labels = arrays[key]
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise OwnDataError(f"{spec.path}: {key} could not be read ({error})") from None
    classes = len(spec.class_names)
    bad = labels[(labels < 0) | (labels >= classes)]
    if len(bad):
        raise OwnDataError(
            f"{spec.path}: {key} holds label {bad[0]}; labels are positions in [data].class_names, 0 to {classes - 1}"
        )
    return tuple(int(n) for n in np.bincount(labels, minlength=classes))


def _load_npz(spec: OwnDataSpec) -> tuple[np.ndarray, np.ndarray, ArrayDataset | None]:
    """Training images and labels, and the test part if the file has one."""
    try:
        with np.load(spec.path, allow_pickle=False) as arrays:
            raw = {key: arrays[key] for key in arrays.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise OwnDataError(f"{spec.path} could not be read ({error})") from None
    x, y = _npz_images(spec, "x", raw["x"]), raw["y"].astype(np.int64)
    if "x_test" not in raw:
        return x, y, None
    return x, y, _pool(_npz_images(spec, "x_test", raw["x_test"]), raw["y_test"].astype(np.int64))


def _npz_images(spec: OwnDataSpec, key: str, x: np.ndarray) -> np.ndarray:
    if x.ndim == 3:
        x = x[:, None]
    if x.dtype == np.uint8:
        return _scaled(x, 255.0)
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise OwnDataError(f"{spec.path}: {key} holds NaN or infinite values")
    if x.size and (x.min() < 0 or x.max() > 1):
        raise OwnDataError(
            f"{spec.path}: {key} holds values from {x.min():g} to {x.max():g}; "
            "float images must be scaled to [0, 1] (or stored as uint8)"
        )
    return x
