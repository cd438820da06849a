"""Data: the datasets as arrays, a device's own images, the non-IID partitions with their true
graph, augmentations, and one node's share of a scenario."""
