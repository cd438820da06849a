"""One node's share of a scenario: its data and the seeds of its model.

The daemon, the simulator and the testnet all build nodes with `build_setup`, so a node of a
testnet starts exactly as the same node of `p2pnode simulate` (same shard, same initial model,
same data order).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..catalog import DATASET_FROM_PATH
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
    """What a network shares about its data: a benchmark dataset (bundled, or from a local `root`),
    or the user's own (`own`), dealt out to its nodes by a non-IID partition; or each node's own
    data (`per_node`), which no partition cuts.

    The one description of a run's data: the simulator's spec holds it (testnet/simulation/spec.py),
    the testnet writes each daemon's `[data]` from it (testnet/launch/learning.py `data_table`), and a
    daemon reads it back from its `[data]` (p2pnode/learning/settings.py `DataSettings.scenario_spec`),
    so daemon i and simulated node i are dealt the same data."""

    dataset: str = "mnist5k"  # a benchmark's name, or DATASET_FROM_PATH: `own`'s files (`[data].dataset`)
    scenario: str = "1"  # the partition (partitions.py SCENARIOS)
    nodes: int = 10
    seed: int = 0  # of the partition and of every node's model
    clusters: int | None = None  # None: the scenario's default (`[data].clusters = 0`)
    samples_per_class: int = 25
    test_per_class: int = 15
    root: str | None = None  # where a torchvision benchmark's files are
    own: OwnDataSpec | None = None  # with dataset DATASET_FROM_PATH: these files, dealt out by the partition
    per_node: tuple[OwnDataSpec, ...] = ()  # instead of a partition: node i's data is per_node[i]

    def __post_init__(self) -> None:
        if self.own is not None and self.per_node:
            raise ValueError("give the run one data source: own data (one, partitioned) or each node's own")
        if (self.own is not None) != (self.dataset == DATASET_FROM_PATH):
            own = "none" if self.own is None else self.own.path
            raise ValueError(f'dataset "{DATASET_FROM_PATH}" goes with own data: got {self.dataset!r}, own data {own}')
        if self.per_node and len(self.per_node) != self.nodes:
            raise ValueError(f"{len(self.per_node)} nodes' data for {self.nodes} nodes")
        _ = self.partition  # a partition that cannot be cut is refused here, not when a node is built

    @property
    def partition(self) -> PartitionSpec:
        """The partition that deals the data out (with `per_node`, it hands each node its own back)."""
        return PartitionSpec(
            self.scenario, self.nodes, self.clusters, self.samples_per_class, self.test_per_class, self.seed
        )


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
    if classes:
        dataset = scenario_dataset(spec)
        return class_list_setup(
            node_id,
            dataset,
            classes,
            node,
            backbone=backbone,
            seed=spec.seed,
            samples_per_class=spec.samples_per_class,
            test_per_class=spec.test_per_class,
        )
    dataset, partition = load_scenario(spec)
    return node_setup(node_id, dataset, partition, node, backbone=backbone, seed=spec.seed, pooled=pooled)


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
