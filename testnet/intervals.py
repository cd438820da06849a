"""Confidence intervals for the accuracies a report compares (docs/learning.md, "Intervals").

- `wilson`: an accuracy of k correct out of n test images. The images are taken as independent
  draws given the trained model, so it covers the luck of the test split, not that of training
  (another seed moves a figure further).
- `paired_bootstrap`: a difference between two methods run on the same nodes (same shards, same
  test splits): the nodes are resampled with replacement, each keeping its pair, and the
  percentile interval of the mean per-node difference is returned. Nodes, not images, are the
  unit because a report keeps each node's accuracy, not each image's prediction.
- `runs_bootstrap`: the same pooled over several runs (seeds): the runs are resampled, then the
  nodes within each, so a run's nodes, which share its luck, are not counted as independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["CONFIDENCE", "BOOTSTRAP_RESAMPLES", "wilson", "paired_bootstrap", "paired_difference", "runs_bootstrap"]

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed, so a report repeats exactly


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


def paired_difference(ours: Sequence[float | None], theirs: Sequence[float | None]) -> dict[str, Any] | None:
    """`paired_bootstrap` of two methods' per-node accuracies, over the nodes both have one for,
    as a report records it; None if there are none."""
    pairs = [(a, b) for a, b in zip(ours, theirs, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    mean, low, high = paired_bootstrap([a for a, _ in pairs], [b for _, b in pairs])
    return {"mean": mean, "low": low, "high": high, "nodes": len(pairs), "method": "paired bootstrap over nodes"}


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
    means = np.empty(resamples)
    for index in range(resamples):
        drawn = [runs[r] for r in rng.integers(0, len(runs), size=len(runs))]
        means[index] = np.concatenate([run[rng.integers(0, run.size, size=run.size)] for run in drawn]).mean()
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(np.concatenate(runs).mean()), float(low), float(high)
