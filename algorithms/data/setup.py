"""One node's share of a scenario: its data and the seeds of its model.

The daemon, the simulator and the testnet all build nodes with `build_setup`, so a node of a
testnet starts exactly as the same node of `p2pnode simulate` (same shard, same initial model,
same data order).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..interface import LocalData, NodeSetup
from ..models.device import CPU
from .datasets import ArrayDataset, Dataset, forget_datasets, load_dataset
from .own_data import OwnDataError, OwnDataSpec, load_own_data, own_dataset
from .partitions import Partition, PartitionSpec, make_partition, parts_partition

__all__ = [
    "ScenarioSpec",
    "load_scenario",
    "scenario_dataset",
    "forget_scenarios",
    "build_setup",
    "node_data",
    "node_seed",
    "node_setup",
    "class_list_data",
    "class_list_setup",
    "own_data_setup",
]


@dataclass(frozen=True)
class ScenarioSpec:
    """A run's data: a benchmark dataset (bundled, or from a local root), or the user's own
    (`own`), dealt out to its nodes by a non-IID partition; or each node's own data (`per_node`),
    which no partition cuts."""

    dataset: str
    partition: PartitionSpec
    root: str | None = None
    own: OwnDataSpec | None = None  # instead of `dataset`: these files, dealt out by `partition`
    per_node: tuple[OwnDataSpec, ...] = ()  # instead of a partition: node i's data is per_node[i]


# What names a partition, under the same keys in a daemon's `[data]` and a simulation's spec.
PARTITION_KEYS = ("scenario", "nodes", "clusters", "samples_per_class", "test_per_class", "seed")


def scenario_of(
    settings: Any,
    dataset: str,
    root: str | None = None,
    own: OwnDataSpec | None = None,
    per_node: tuple[OwnDataSpec, ...] = (),
) -> ScenarioSpec:
    """The scenario that `settings` (anything with the PARTITION_KEYS: a daemon's `[data]`, a
    `SimulationSpec`) describes: the one place a run's partition is put together, so daemon i and
    the simulator's node i are dealt the same data."""
    values = {key: getattr(settings, key) for key in PARTITION_KEYS}
    values["clusters"] = values["clusters"] or None  # `[data].clusters = 0`: the scenario's default
    return ScenarioSpec(dataset, PartitionSpec(**values), root, own, per_node)


@functools.lru_cache(maxsize=4)
def load_scenario(spec: ScenarioSpec) -> tuple[Dataset, Partition]:
    """The dataset and its partition (cached: a simulator builds every node from one copy)."""
    if spec.per_node:
        return _per_node_scenario(spec.per_node, spec.partition)
    dataset = scenario_dataset(spec)
    return dataset, make_partition(dataset, spec.partition)


def scenario_dataset(spec: ScenarioSpec) -> Dataset:
    """The dataset a partition deals out: the own data's, or the named benchmark's."""
    return own_dataset(spec.own) if spec.own is not None else load_dataset(spec.dataset, spec.root)


def _per_node_scenario(parts: tuple[OwnDataSpec, ...], spec: PartitionSpec) -> tuple[Dataset, Partition]:
    """Each node's own data, split as its daemon splits it (`load_own_data`), pooled in node
    order into one dataset named after their folder; the partition hands each node its part back."""
    loaded = [load_own_data(part) for part in parts]
    shapes = {part.path.name: train.images.shape[1:] for part, (train, _) in zip(parts, loaded, strict=True)}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {'×'.join(map(str, shape))}" for name, shape in shapes.items())
        raise OwnDataError(f"the nodes' images differ in shape ({listed}); every node's must have one shape")

    def pooled(split: int) -> ArrayDataset:
        images = np.concatenate([pair[split].images for pair in loaded])
        images.setflags(write=False)
        labels = np.concatenate([pair[split].labels for pair in loaded])
        labels.setflags(write=False)
        return ArrayDataset(images, labels)

    name = parts[0].path.parent.name
    train, test = pooled(0), pooled(1)
    dataset = Dataset(name, len(parts[0].class_names), tuple(train.images.shape[1:]), train, test)
    partition = parts_partition(name, [pair[0].labels for pair in loaded], [pair[1].labels for pair in loaded], spec)
    return dataset, partition


def forget_scenarios() -> None:
    """Drop the cached datasets and partitions: a process that builds one node (the daemon)
    then holds that node's tensors only, not the whole dataset they were cut from."""
    load_scenario.cache_clear()
    forget_datasets()


def build_setup(
    spec: ScenarioSpec,
    node: int,
    node_id: str,
    *,
    backbone: str,
    pooled: bool = False,
    classes: tuple[int, ...] = (),
    device: torch.device = CPU,
    mixed_precision: bool = False,
) -> NodeSetup:
    """Node `node` of the scenario: its shard (its cluster's pooled shard if `pooled`: the
    oracle), or, if `classes` are named, draws of those classes instead (`class_list_data`);
    its data on `device`, where its algorithm will train (algorithms/models/device.py)."""
    return _cpu_setup(spec, node, node_id, backbone=backbone, pooled=pooled, classes=classes).on(
        device, mixed_precision
    )


def _cpu_setup(
    spec: ScenarioSpec, node: int, node_id: str, *, backbone: str, pooled: bool, classes: tuple[int, ...]
) -> NodeSetup:
    seed = spec.partition.seed
    if classes:
        dataset = scenario_dataset(spec)
        partition = spec.partition
        return class_list_setup(
            node_id,
            dataset,
            classes,
            node,
            backbone=backbone,
            seed=seed,
            samples_per_class=partition.samples_per_class,
            test_per_class=partition.test_per_class,
        )
    dataset, partition = load_scenario(spec)
    return node_setup(node_id, dataset, partition, node, backbone=backbone, seed=seed, pooled=pooled)


def node_data(dataset: Dataset, partition: Partition, node: int, *, pooled: bool) -> LocalData:
    """A node's tensors: its training shard (or its cluster's pooled shard) and its own test split."""
    shard = partition.shards[node]
    train_idx = partition.cluster_train_indices(shard.cluster) if pooled else shard.train_indices
    test_pool = dataset.train if shard.test_from_train_pool else dataset.test
    return LocalData(
        train_images=torch.tensor(dataset.train.images[train_idx]),
        train_labels=torch.tensor(dataset.train.labels[train_idx]),
        test_images=torch.tensor(test_pool.images[shard.test_indices]),
        test_labels=torch.tensor(test_pool.labels[shard.test_indices]),
        num_classes=dataset.num_classes,
    )


def node_seed(seed: int, node: int) -> int:
    """Node `node`'s own seed (its model, data order, augmentations) within a run's `seed`."""
    return seed * 1_000_003 + node


def node_setup(
    node_id: str, dataset: Dataset, partition: Partition, node: int, *, backbone: str, seed: int, pooled: bool = False
) -> NodeSetup:
    """Node `node` of the partition; `seed` is the run's seed, shared by every node."""
    return NodeSetup(
        node_id=node_id,
        data=node_data(dataset, partition, node, pooled=pooled),
        backbone=backbone,
        seed=node_seed(seed, node),
        shared_seed=seed,
    )


def class_list_setup(
    node_id: str,
    dataset: Dataset,
    classes: tuple[int, ...],
    node: int,
    *,
    backbone: str,
    seed: int,
    samples_per_class: int,
    test_per_class: int,
) -> NodeSetup:
    """A node that names its own classes (see `class_list_data`) instead of holding a shard."""
    own_seed = node_seed(seed, node)
    data = class_list_data(dataset, classes, samples_per_class, test_per_class, own_seed)
    return NodeSetup(node_id=node_id, data=data, backbone=backbone, seed=own_seed, shared_seed=seed)


def class_list_data(
    dataset: Dataset, classes: tuple[int, ...], samples_per_class: int, test_per_class: int, seed: int
) -> LocalData:
    """A node that names its own classes instead of taking shard i of a scenario: up to
    `samples_per_class` training and `test_per_class` test images of each, drawn with `seed`.
    Its test images are never its training images; unlike a scenario's shards, two nodes that
    choose their classes this way may draw the same images."""
    if not classes:
        raise ValueError("give at least one class")
    bad = [k for k in classes if not 0 <= k < dataset.num_classes]
    if bad:
        raise ValueError(f"classes {bad} are not among the {dataset.num_classes} classes of {dataset.name}")
    rng = np.random.default_rng([seed, 0x636C6173])  # "clas"
    train_idx, test_idx = [], []
    for k in sorted(set(classes)):
        pool = rng.permutation(np.flatnonzero(dataset.train.labels == k))
        train_idx.append(pool[:samples_per_class])
        if dataset.test is None:
            test_idx.append(pool[samples_per_class : samples_per_class + test_per_class])
        else:
            test_idx.append(rng.permutation(np.flatnonzero(dataset.test.labels == k))[:test_per_class])
    test_pool = dataset.train if dataset.test is None else dataset.test
    train, test = np.concatenate(train_idx), np.concatenate(test_idx)
    return LocalData(
        train_images=torch.tensor(dataset.train.images[train]),
        train_labels=torch.tensor(dataset.train.labels[train]),
        test_images=torch.tensor(test_pool.images[test]),
        test_labels=torch.tensor(test_pool.labels[test]),
        num_classes=dataset.num_classes,
    )


def own_data_setup(
    node_id: str,
    spec: OwnDataSpec,
    *,
    backbone: str,
    device: torch.device = CPU,
    mixed_precision: bool = False,
    damaged: list[str] | None = None,
) -> NodeSetup:
    """A node that trains on its own files (`own_data.py`) instead of a benchmark's shard, on
    `device`. Its own seed is node `spec.node`'s of a simulation, or without one comes from its
    node id. `damaged`: load_own_data's."""
    train, test = load_own_data(spec, damaged)
    data = LocalData(
        train_images=torch.tensor(train.images),
        train_labels=torch.tensor(train.labels),
        test_images=torch.tensor(test.images),
        test_labels=torch.tensor(test.labels),
        num_classes=len(spec.class_names),
    )
    own_seed = node_seed(spec.seed, zlib.crc32(node_id.encode()) if spec.node is None else spec.node)
    setup = NodeSetup(node_id=node_id, data=data, backbone=backbone, seed=own_seed, shared_seed=spec.seed)
    return setup.on(device, mixed_precision)
