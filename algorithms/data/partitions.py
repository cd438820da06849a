"""Deterministic non-IID partitions of a dataset over nodes, with the ground-truth graph W*.

A partition is a pure function of (dataset, spec), the seed being part of the spec: every
process that computes it gets the same shards, so a node can compute the whole partition and
keep its own shard.

Nodes form contiguous blocks of clusters (node i is in cluster `i * C // nodes`), so W*
heatmaps show blocks. Scenarios:

- "1": disjoint class sets: range(K) split into C contiguous, nearly equal groups.
- "2": overlapping class sets: windows of width w = min(K, round(K / C) + 2) starting at
  round(c * (K - w) / (C - 1)); for K = 10, C = 2 that is {0..6} and {3..9}, as in MAPL.
- "3" / "4": as "1" / "2", but each node draws its training count of each own class
  independently and uniformly from the integers in [ceil(n/2), floor(3n/2)],
  n = samples_per_class, so nodes of one cluster hold different amounts of data.
- "noniid-sbm" (SCooL): C groups (default K // 2), group c owns a disjoint block of K // C
  classes: {0, 1}, {2, 3}, ... by default.
- "noniid" (pathological): each node owns `classes_per_node` random classes; nodes with the
  same class set form a cluster, numbered in order of first appearance.
- "dirichlet" (label skew): cluster c draws class proportions q_c ~ Dir(alpha·1_K); each of
  its nodes gets round(n · K · q_c[k]) training samples of class k, and owns the classes with
  at least one.

`parts_partition` is no scenario: it wraps nodes that each bring their own data (their parts,
pooled in node order) as a partition, so the simulator, its baselines and reports take them.

Every node gets `test_per_class` test samples of each own class. No image is in two shards,
and a node's test images are nobody's training images: per class, one seeded permutation of
the pool is cut into consecutive chunks, first all training chunks, then all test chunks
(from the test pool's own permutation when the dataset has one). When a class has too few
images, samples_per_class and test_per_class shrink by a common factor and a note says so.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..catalog import SCENARIOS  # named there, for the daemon's config check
from .datasets import Dataset

__all__ = ["SCENARIOS", "Partition", "PartitionError", "PartitionSpec", "Shard", "make_partition", "parts_partition"]


class PartitionError(ValueError):
    """A partition cannot be made as asked; the message says why."""


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PartitionError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise PartitionError(f"{name} must be at least {minimum}, got {value}")


@dataclass(frozen=True)
class PartitionSpec:
    scenario: str
    nodes: int
    clusters: int | None = None  # None: 2 for 1–4 and dirichlet, num_classes // 2 for noniid-sbm; noniid ignores it
    samples_per_class: int = 25  # training samples per class per node
    test_per_class: int = 15  # test samples per own class per node
    seed: int = 0
    classes_per_node: int = 2  # noniid only
    dirichlet_alpha: float = 0.5  # dirichlet only

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise PartitionError(f"unknown scenario {self.scenario!r}; choose one of: {', '.join(SCENARIOS)}")
        _require_int("nodes", self.nodes, 1)
        if self.clusters is not None:
            _require_int("clusters", self.clusters, 1)
            if self.clusters > self.nodes:
                raise PartitionError(f"clusters ({self.clusters}) cannot exceed nodes ({self.nodes})")
        _require_int("samples_per_class", self.samples_per_class, 1)
        _require_int("test_per_class", self.test_per_class, 1)
        _require_int("seed", self.seed, 0)  # numpy seeds must be non-negative
        _require_int("classes_per_node", self.classes_per_node, 1)
        alpha = self.dirichlet_alpha
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float, np.number))
            or not (math.isfinite(alpha) and alpha > 0)
        ):
            raise PartitionError(f"dirichlet_alpha must be a finite number > 0, got {alpha!r}")


@dataclass(frozen=True)
class Shard:
    node: int
    cluster: int  # ground-truth group id
    classes: tuple[int, ...]  # sorted own classes
    train_indices: np.ndarray  # int64 indices into dataset.train
    test_indices: np.ndarray  # int64 indices into dataset.test if it exists, else into dataset.train
    test_from_train_pool: bool


@dataclass(frozen=True)
class Partition:
    dataset: str
    spec: PartitionSpec  # the spec as requested
    samples_per_class: int  # effective values, after any scaling
    test_per_class: int
    shards: tuple[Shard, ...]
    w_true: np.ndarray  # nodes×nodes float64, row-normalised same-cluster indicator (self included)
    notes: tuple[str, ...]  # human-readable notes, e.g. about scaling

    @property
    def num_clusters(self) -> int:
        return len({shard.cluster for shard in self.shards})

    def cluster_train_indices(self, cluster: int) -> np.ndarray:
        """Pooled, sorted training indices of one cluster's nodes (for the "oracle" baseline)."""
        members = [shard.train_indices for shard in self.shards if shard.cluster == cluster]
        if not members:
            raise PartitionError(f"no cluster {cluster}; clusters are 0..{self.num_clusters - 1}")
        return _frozen(np.sort(np.concatenate(members)))


@dataclass(frozen=True)
class _Layout:
    """What a scenario decides before any sample count is known."""

    cluster_of: np.ndarray  # nodes, int64
    weights: np.ndarray  # nodes×K float64: training count of class k is about weights[i, k] * n
    jitter: np.ndarray | None  # nodes×K uniform [0, 1) draws of scenarios 3 and 4


def make_partition(dataset: Dataset, spec: PartitionSpec) -> Partition:
    num_classes = dataset.num_classes
    notes: list[str] = []
    clusters = _resolve_clusters(spec, num_classes, notes)
    # Independent streams: changing sample counts never changes who owns which classes.
    root = np.random.SeedSequence([spec.seed, zlib.crc32(f"{spec.scenario}\0{dataset.name}".encode())])
    structure_rng, count_rng, sample_rng = (np.random.default_rng(child) for child in root.spawn(3))
    layout = _layout(spec, num_classes, clusters, structure_rng, count_rng, notes)

    train_pool = np.asarray(dataset.train.labels)
    test_pool = None if dataset.test is None else np.asarray(dataset.test.labels)
    train_available = np.bincount(train_pool[(train_pool >= 0) & (train_pool < num_classes)], minlength=num_classes)
    test_available = None
    if test_pool is not None:
        test_available = np.bincount(test_pool[(test_pool >= 0) & (test_pool < num_classes)], minlength=num_classes)

    samples, tests = _fit(dataset.name, spec, layout, train_available, test_available, notes)
    train_counts = _train_counts(layout, samples)
    test_counts = np.where(train_counts > 0, tests, 0)

    train_chunks = _deal(train_pool, train_counts, sample_rng, offset=np.zeros(num_classes, dtype=np.int64))
    if test_pool is None:
        # Same permutation as the training chunks, continuing after them: disjoint by construction.
        test_chunks = _deal(
            train_pool, test_counts, None, offset=train_counts.sum(axis=0), reuse=train_chunks.permutations
        )
    else:
        test_chunks = _deal(test_pool, test_counts, sample_rng, offset=np.zeros(num_classes, dtype=np.int64))

    shards = tuple(
        Shard(
            node=node,
            cluster=int(layout.cluster_of[node]),
            classes=tuple(int(k) for k in np.flatnonzero(train_counts[node])),
            train_indices=train_chunks.per_node[node],
            test_indices=test_chunks.per_node[node],
            test_from_train_pool=test_pool is None,
        )
        for node in range(spec.nodes)
    )
    same = (layout.cluster_of[:, None] == layout.cluster_of[None, :]).astype(np.float64)
    w_true = _frozen(same / same.sum(axis=1, keepdims=True))
    return Partition(dataset.name, spec, samples, tests, shards, w_true, tuple(notes))


def parts_partition(
    name: str, train_labels: list[np.ndarray], test_labels: list[np.ndarray], spec: PartitionSpec
) -> Partition:
    """Node i's shard is the i-th part: the i-th block of the training pool and of the test pool,
    the pools being the parts' labels concatenated in node order. `spec` gives the nodes and the
    seed (nothing is drawn). Nodes that own the same classes form a cluster, numbered in order
    of first appearance, as in "noniid"; `samples_per_class` and `test_per_class` are the
    parts' means per own class, and a note gives their ranges."""
    if len(train_labels) != spec.nodes or len(test_labels) != spec.nodes:
        raise PartitionError(f"{len(train_labels)} parts for {spec.nodes} nodes: give one part per node")
    train_ends, test_ends = np.cumsum([len(y) for y in train_labels]), np.cumsum([len(y) for y in test_labels])
    first_seen: dict[tuple[int, ...], int] = {}
    shards, per_class = [], []
    for node, (train, test) in enumerate(zip(train_labels, test_labels, strict=True)):
        classes = tuple(int(k) for k in np.unique(train))
        shards.append(
            Shard(
                node=node,
                cluster=first_seen.setdefault(classes, len(first_seen)),
                classes=classes,
                train_indices=_frozen(np.arange(train_ends[node] - len(train), train_ends[node], dtype=np.int64)),
                test_indices=_frozen(np.arange(test_ends[node] - len(test), test_ends[node], dtype=np.int64)),
                test_from_train_pool=False,
            )
        )
        per_class.append((len(train) / len(classes), len(test) / len(classes)))
    cluster_of = np.array([shard.cluster for shard in shards])
    same = (cluster_of[:, None] == cluster_of[None, :]).astype(np.float64)
    trains, tests = np.array(per_class).T
    note = (
        f"each node trains on its own data: {trains.min():.0f} to {trains.max():.0f} training and "
        f"{tests.min():.0f} to {tests.max():.0f} test images per own class"
    )
    samples, held = round(float(trains.mean())), round(float(tests.mean()))
    return Partition(name, spec, samples, held, tuple(shards), _frozen(same / same.sum(axis=1, keepdims=True)), (note,))


def _resolve_clusters(spec: PartitionSpec, num_classes: int, notes: list[str]) -> int:
    if spec.scenario == "noniid":
        if spec.clusters is not None:
            notes.append(f"noniid ignores clusters={spec.clusters}: nodes with the same class set form a cluster")
        return 0  # decided by the draws
    if spec.clusters is not None:
        clusters = spec.clusters
    else:
        default = num_classes // 2 if spec.scenario == "noniid-sbm" else 2
        clusters = max(1, min(default, spec.nodes))
        if clusters != default:
            notes.append(f"clusters defaulted to {clusters}, not {default}: there are only {spec.nodes} nodes")
    if spec.scenario in ("1", "3") and clusters > num_classes:
        raise PartitionError(
            f"scenario {spec.scenario} gives each cluster its own classes: "
            f"clusters ({clusters}) cannot exceed the {num_classes} classes"
        )
    if spec.scenario == "noniid-sbm" and num_classes // clusters < 1:
        raise PartitionError(
            f"noniid-sbm gives each group num_classes // clusters classes: "
            f"{num_classes} // {clusters} is 0; use at most {num_classes} clusters"
        )
    return clusters


def _class_sets(scenario: str, num_classes: int, clusters: int) -> list[np.ndarray]:
    """Own classes of each cluster, for the scenarios where a cluster fixes them."""
    if scenario in ("1", "3"):
        return np.array_split(np.arange(num_classes), clusters)
    if scenario in ("2", "4"):
        width = min(num_classes, round(num_classes / clusters) + 2)
        starts = [0] if clusters == 1 else [round(c * (num_classes - width) / (clusters - 1)) for c in range(clusters)]
        return [np.arange(start, start + width) for start in starts]
    block = num_classes // clusters  # noniid-sbm
    return [np.arange(c * block, (c + 1) * block) for c in range(clusters)]


def _layout(
    spec: PartitionSpec,
    num_classes: int,
    clusters: int,
    structure_rng: np.random.Generator,
    count_rng: np.random.Generator,
    notes: list[str],
) -> _Layout:
    nodes = spec.nodes
    weights = np.zeros((nodes, num_classes))
    if spec.scenario == "noniid":
        if spec.classes_per_node > num_classes:
            raise PartitionError(f"classes_per_node ({spec.classes_per_node}) cannot exceed the {num_classes} classes")
        first_seen: dict[tuple[int, ...], int] = {}
        cluster_of = np.zeros(nodes, dtype=np.int64)
        for node in range(nodes):
            own = np.sort(structure_rng.choice(num_classes, size=spec.classes_per_node, replace=False))
            cluster_of[node] = first_seen.setdefault(tuple(own.tolist()), len(first_seen))
            weights[node, own] = 1.0
        return _Layout(cluster_of, weights, None)

    cluster_of = np.arange(nodes, dtype=np.int64) * clusters // nodes
    if spec.scenario == "dirichlet":
        # Scaled so that weights average 1 per class: n is still "samples per class".
        proportions = structure_rng.dirichlet(np.full(num_classes, spec.dirichlet_alpha), size=clusters)
        return _Layout(cluster_of, num_classes * proportions[cluster_of], None)

    class_sets = _class_sets(spec.scenario, num_classes, clusters)
    distinct = {tuple(own.tolist()) for own in class_sets}
    if len(distinct) < clusters:
        notes.append(
            f"only {len(distinct)} of the {clusters} clusters have distinct class sets: "
            "W* separates clusters that share a distribution"
        )
    for node in range(nodes):
        weights[node, class_sets[cluster_of[node]]] = 1.0
    jitter = count_rng.random((nodes, num_classes)) if spec.scenario in ("3", "4") else None
    return _Layout(cluster_of, weights, jitter)


def _train_counts(layout: _Layout, samples: int) -> np.ndarray:
    """nodes×K training counts for `samples` per class; monotone in `samples`, which `_fit` relies on."""
    if layout.jitter is not None:
        low, high = math.ceil(samples / 2), (3 * samples) // 2
        drawn = low + np.floor(layout.jitter * (high - low + 1)).astype(np.int64)
        return np.where(layout.weights > 0, drawn, 0)
    counts = np.rint(layout.weights * samples).astype(np.int64)
    # Dirichlet can round every class of a node to zero; keep its most likely one.
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    counts[empty, np.argmax(layout.weights[empty], axis=1)] = 1
    return counts


def _shortage(
    name: str,
    layout: _Layout,
    samples: int,
    tests: int,
    train_available: np.ndarray,
    test_available: np.ndarray | None,
) -> str | None:
    """None if the pools can serve these counts, else a sentence about the class shortest of images."""
    train_counts = _train_counts(layout, samples)
    owners = (train_counts > 0).sum(axis=0)
    train_demand = train_counts.sum(axis=0)
    test_demand = tests * owners
    if test_available is None:
        pools = [("", train_demand + test_demand, train_available)]
    else:
        pools = [("", train_demand, train_available), (" test", test_demand, test_available)]
    worst: tuple[float, str] | None = None
    for pool, demand, available in pools:
        ratio = available / np.maximum(demand, 1)
        k = int(np.argmin(ratio))
        if demand[k] > available[k] and (worst is None or ratio[k] < worst[0]):
            sentence = f"{name} has {available[k]}{pool} images of class {k}; {owners[k]} nodes need {demand[k]}"
            worst = (float(ratio[k]), sentence)
    return None if worst is None else worst[1]


def _fit(
    name: str,
    spec: PartitionSpec,
    layout: _Layout,
    train_available: np.ndarray,
    test_available: np.ndarray | None,
    notes: list[str],
) -> tuple[int, int]:
    """The largest (samples, tests), scaled down from the spec by one common factor, that the pools can serve."""
    samples, tests = spec.samples_per_class, spec.test_per_class
    problem = _shortage(name, layout, samples, tests, train_available, test_available)
    if problem is None:
        return samples, tests

    # Candidate factors f give (max(1, floor(samples·f)), max(1, floor(tests·f))). Demand grows
    # with f, so a binary search finds the largest that fits; Fractions keep the floors exact.
    factors = sorted(
        {Fraction(a, samples) for a in range(1, samples + 1)} | {Fraction(b, tests) for b in range(1, tests + 1)}
    )

    def scaled(factor: Fraction) -> tuple[int, int]:
        return max(1, math.floor(samples * factor)), max(1, math.floor(tests * factor))

    smallest = scaled(factors[0])
    hopeless = _shortage(name, layout, *smallest, train_available, test_available)
    if hopeless is not None:
        raise PartitionError(
            f"{hopeless} even at {smallest[0]} training and {smallest[1]} test samples per class; "
            "use fewer nodes or a larger dataset"
        )
    low, high = 0, len(factors) - 1  # factors[low] fits; find the largest that does
    while low < high:
        middle = (low + high + 1) // 2
        if _shortage(name, layout, *scaled(factors[middle]), train_available, test_available) is None:
            low = middle
        else:
            high = middle - 1
    new_samples, new_tests = scaled(factors[low])
    notes.append(f"{problem}: samples per class scaled {samples}→{new_samples}, test per class {tests}→{new_tests}")
    return new_samples, new_tests


@dataclass(frozen=True)
class _Dealt:
    per_node: list[np.ndarray]
    permutations: list[np.ndarray]  # per class, the shuffled pool indices the chunks were cut from


def _deal(
    labels: np.ndarray,
    counts: np.ndarray,
    rng: np.random.Generator | None,
    offset: np.ndarray,
    reuse: list[np.ndarray] | None = None,
) -> _Dealt:
    """Cut each class's shuffled indices, from `offset` on, into consecutive chunks of `counts[node, class]`."""
    nodes, num_classes = counts.shape
    pieces: list[list[np.ndarray]] = [[] for _ in range(nodes)]
    permutations = []
    for k in range(num_classes):
        # Every class is shuffled, needed or not, so the stream and thus each chunk depend only on the seed.
        order = reuse[k] if reuse is not None else rng.permutation(np.flatnonzero(labels == k))
        permutations.append(order)
        ends = offset[k] + np.cumsum(counts[:, k])
        starts = ends - counts[:, k]
        for node in np.flatnonzero(counts[:, k]):
            pieces[node].append(order[starts[node] : ends[node]])
    per_node = [
        _frozen(np.sort(np.concatenate(p)).astype(np.int64) if p else np.zeros(0, dtype=np.int64)) for p in pieces
    ]
    return _Dealt(per_node, permutations)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array
