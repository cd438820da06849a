"""Euclidean projection onto the probability simplex {w : w ≥ 0, Σ w = 1}.

Exact, not iterative: the sort-based algorithm (Held, Wolfe & Crowder 1974; Duchi et al. 2008).
It finds the threshold θ with Σ max(v − θ, 0) = 1 and returns max(v − θ, 0), so entries below the
threshold become exact zeros: that is what makes a learned collaboration graph sparse.
"""

from __future__ import annotations

import numpy as np

__all__ = ["project_to_simplex"]


def project_to_simplex(values: np.ndarray, radius: float = 1.0) -> np.ndarray:
    """argmin_w ‖w − values‖₂ subject to w ≥ 0, Σ w = radius, for a 1-D float vector."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"need a non-empty vector, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("cannot project a vector with NaN or infinite entries")
    if not radius > 0:
        raise ValueError(f"radius must be positive, got {radius}")
    # The projection commutes with adding a constant to every entry; shifting by the maximum keeps
    # the cumulative sums below from overflowing for huge inputs.
    shift = v.max()
    u = np.sort(v - shift)[::-1]
    cumulative = np.cumsum(u) - radius
    ranks = np.arange(1, v.size + 1)
    support = np.nonzero(u - cumulative / ranks > 0)[0]
    rho = support[-1] + 1  # never empty: the largest entry always qualifies
    threshold = cumulative[rho - 1] / rho
    w = np.maximum(v - shift - threshold, 0.0)
    # Rounding can leave Σ w a few ulps away from the radius; rescale the (non-empty) support.
    return w * (radius / w.sum())
