"""Confidence intervals for the accuracies a report compares (docs/learning.md, "Intervals").

- `wilson`: an accuracy of k correct out of n test images. The images are taken as independent
  draws given the trained model, so it covers the luck of the test split, not that of training
  (another seed moves a figure further).
- `paired_bootstrap`: a difference between two methods run on the same nodes (same shards, same
  test splits): the nodes are resampled with replacement, each keeping its pair, and the
  percentile interval of the mean per-node difference is returned. It covers how the gain
  varies from node to node, and it needs nodes: below `SMALL_FLEET` a bootstrap over 2-7
  values returns little more than their range (issue #45: a 2-node fleet "excluded 0" on the
  two nodes' own values).
- `images_bootstrap`: the same difference on a fleet below `SMALL_FLEET`, where each node kept
  which of its test images each method got right: every node's images are resampled with
  replacement, each keeping its pair, and the mean over nodes of the per-node difference taken.
  It covers the luck of the test images only, not of training (another seed moves a figure
  further), and says how many images and nodes it rests on.
- `runs_bootstrap`: the same pooled over several runs (seeds): the runs are resampled, then the
  nodes within each, so a run's nodes, which share its luck, are not counted as independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "CONFIDENCE",
    "BOOTSTRAP_RESAMPLES",
    "SMALL_FLEET",
    "wilson",
    "paired_bootstrap",
    "images_bootstrap",
    "paired_difference",
    "runs_bootstrap",
]

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed, so a report repeats exactly
# Below this many nodes a difference's interval is over test images, not nodes: 7 values give
# 1,716 distinct resamples, and the percentile interval of their mean is close to their range.
SMALL_FLEET = 8


def wilson(correct: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of the proportion correct/n."""
    if n <= 0 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n and n > 0, got {correct}/{n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = correct / n
    shrink = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / shrink
    half = z / shrink * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 and n the bounds are exactly 0 and 1; rounding would leave them a hair off.
    return (0.0 if correct == 0 else centre - half), (1.0 if correct == n else centre + half)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(mean of a − b, low, high): the percentile bootstrap interval of the mean paired difference."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.ndim != 1 or diff.size == 0 or not np.all(np.isfinite(diff)):
        raise ValueError("need two equally long, non-empty lists of finite numbers")
    picks = np.random.default_rng(seed).integers(0, diff.size, size=(resamples, diff.size))
    means = diff[picks].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(diff.mean()), float(low), float(high)


def images_bootstrap(
    ours: Sequence[np.ndarray],
    theirs: Sequence[np.ndarray],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(mean, low, high) of the mean over nodes of accuracy(ours) − accuracy(theirs), where node
    i's entries are whether each method got each of its test images right (the same images, in
    the same order): each resample redraws every node's images with replacement, pairs kept. A
    node's resampled difference is (wins − losses) / n, so it is drawn as a multinomial of its
    images' three outcomes, whatever its test split's size."""
    if not ours or len(ours) != len(theirs):
        raise ValueError("need the same non-empty list of nodes for both methods")
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    means = []
    for a, b in zip(ours, theirs, strict=True):
        a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
        if a.shape != b.shape or a.ndim != 1 or a.size == 0:
            raise ValueError("each node needs the same non-empty list of test images for both methods")
        n = a.size
        outcomes = np.array([np.sum(a & ~b), np.sum(~a & b), np.sum(a == b)]) / n  # win, loss, tie
        drawn = rng.multinomial(n, outcomes, size=resamples)
        total += (drawn[:, 0] - drawn[:, 1]) / n
        means.append(outcomes[0] - outcomes[1])
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(total / len(ours), [tail, 100 - tail])
    return float(np.mean(means)), float(low), float(high)


def paired_difference(
    ours: Sequence[float | None],
    theirs: Sequence[float | None],
    ours_right: Sequence[np.ndarray | None] | None = None,
    theirs_right: Sequence[np.ndarray | None] | None = None,
) -> dict[str, Any] | None:
    """Two methods' per-node accuracies compared over the nodes both have one for, as a report
    records it: `paired_bootstrap` over nodes, or on a fleet below SMALL_FLEET nodes
    `images_bootstrap` where both kept each test image's outcome (`*_right`, per node). Without
    them a small fleet gets its mean difference and no interval. None if no node has both."""
    n = len(ours)
    ours_right, theirs_right = ours_right or [None] * n, theirs_right or [None] * n
    pairs = [
        (a, b, ra, rb)
        for a, b, ra, rb in zip(ours, theirs, ours_right, theirs_right, strict=True)
        if a is not None and b is not None
    ]
    if not pairs:
        return None
    nodes = len(pairs)
    if nodes >= SMALL_FLEET:
        mean, low, high = paired_bootstrap([a for a, *_ in pairs], [b for _, b, *_ in pairs])
        return {
            "mean": mean,
            "low": low,
            "high": high,
            "nodes": nodes,
            "unit": "nodes",
            "method": "paired bootstrap over nodes",
        }
    rights = [(ra, rb) for *_, ra, rb in pairs if ra is not None and rb is not None and len(ra) == len(rb)]
    if len(rights) < nodes:  # not every node kept its images' outcomes: no interval to give
        mean = float(np.mean([a - b for a, b, *_ in pairs]))
        said = (
            f"no interval: {nodes} nodes are too few for one over nodes, and not every node kept its images' outcomes"
        )
        return {"mean": mean, "low": None, "high": None, "nodes": nodes, "unit": None, "method": said}
    mean, low, high = images_bootstrap([ra for ra, _ in rights], [rb for _, rb in rights])
    images = sum(len(ra) for ra, _ in rights)
    return {
        "mean": mean,
        "low": low,
        "high": high,
        "nodes": nodes,
        "unit": "images",
        "images": images,
        "method": f"paired bootstrap over the {images} test images of {nodes} nodes: their luck, not training's",
    }


def runs_bootstrap(
    differences: Sequence[Sequence[float]],
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """(mean, low, high) of per-node paired differences grouped by run: each resample draws the
    runs with replacement, then each drawn run's nodes with replacement, and takes the mean of
    every node drawn. The mean is the plain mean over all nodes."""
    runs = [np.asarray(run, dtype=float) for run in differences]
    if not runs or any(run.ndim != 1 or run.size == 0 or not np.all(np.isfinite(run)) for run in runs):
        raise ValueError("need at least one run, each a non-empty list of finite numbers")
    rng = np.random.default_rng(seed)
    # All resamples at once: runs padded to the longest, each drawn run's nodes drawn as
    # floor(u · its size), the padding masked out of the sums.
    sizes = np.array([run.size for run in runs])
    padded = np.zeros((len(runs), sizes.max()))
    for index, run in enumerate(runs):
        padded[index, : run.size] = run
    drawn = rng.integers(0, len(runs), size=(resamples, len(runs)))  # runs, per resample
    drawn_sizes = sizes[drawn][..., None]
    nodes = (rng.random((*drawn.shape, sizes.max())) * drawn_sizes).astype(int)
    taken = np.arange(sizes.max()) < drawn_sizes  # a run of n nodes draws n of them
    means = (padded[drawn[..., None], nodes] * taken).sum(axis=(1, 2)) / taken.sum(axis=(1, 2))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(np.concatenate(runs).mean()), float(low), float(high)
