"""One node's share of a scenario: its data and the seeds of its model.

The simulator and the daemon both build nodes here, so a node of a testnet starts exactly as
the same node of `p2pnode simulate` (same shard, same initial model, same data order).
"""

from __future__ import annotations

import torch

from .datasets import Dataset
from .partitions import Partition
from .seam import LocalData, NodeSetup

__all__ = ["node_data", "node_setup"]


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


def node_setup(node_id: str, dataset: Dataset, partition: Partition, node: int, *, backbone: str, seed: int,
               pooled: bool = False) -> NodeSetup:
    """Node `node` of the partition; `seed` is the run's seed, shared by every node."""
    return NodeSetup(node_id=node_id, data=node_data(dataset, partition, node, pooled=pooled), backbone=backbone,
                     seed=seed * 1_000_003 + node, shared_seed=seed)
