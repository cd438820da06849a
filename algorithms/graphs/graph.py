"""Collaborative graph learning (MAPL's CGL) for one node, and the graph metrics of a report.

Node i keeps a weight vector w over its candidates (itself and the peers it can see) on the
probability simplex. Each graph step takes E_g projected gradient steps on

    L(w) = μ1 · Σ_j γ_j (−s_ij) w_j  +  μ2 · (β ‖w‖₂ − log(deg(w) + ε)),   deg(w) = Σ_{j≠i} w_j

where s_ij is the similarity of the classifier heads and γ_j = n_j / Σ n the confidence from the
dataset sizes peers advertise. The similarity term pulls weight to similar peers, the norm spreads
it, and −log(deg) keeps the node from talking only to itself. Unlike the public MAPL code (which
reads the degree from the previous round, so that term has no gradient) the log-degree term is
differentiated here: ∂/∂w_j = −1/(deg + ε) for every peer j ≠ i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .simplex import project_to_simplex

__all__ = [
    "GraphConfig",
    "GraphOptimizer",
    "SIMILARITIES",
    "NORMALISATIONS",
    "head_similarity",
    "row_cosines",
    "normalise_similarities",
    "cgl_loss",
    "cgl_gradient",
    "l1_to_truth",
    "within_cluster_mass",
    "communities",
    "adjusted_rand_index",
]


@dataclass(frozen=True)
class GraphConfig:
    """CGL hyper-parameters. The loss is the paper's; where a default differs from the public
    MAPL code (its value in the comment), docs/learning.md gives the measurement behind it."""

    mu_similarity: float = 20.0  # μ1 (code: 0.5)
    mu_regulariser: float = 0.1  # μ2
    l2_weight: float = 15.0  # β (code: a config value)
    epsilon: float = 1e-6  # ε inside log(deg + ε)
    steps: int = 50  # E_g projected steps per round (code: 1)
    optimizer: str = "gradient"  # "gradient" (projected gradient) | "adam" (the code's)
    learning_rate: float = 0.3  # (code: Adam, 0.1)
    betas: tuple[float, float] = (0.5, 0.999)  # adam only
    similarity: str = "update-gram"  # see head_similarity (paper: "cosine")
    normalise_similarity: str = "max"  # see normalise_similarities

    def __post_init__(self) -> None:
        for name in ("mu_similarity", "mu_regulariser", "l2_weight", "learning_rate"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"graph.{name} must be a finite number ≥ 0, got {getattr(self, name)}")
        if not (0 < self.epsilon < 1):
            raise ValueError(f"graph.epsilon must be in (0, 1), got {self.epsilon}")
        if self.steps < 1:
            raise ValueError(f"graph.steps must be ≥ 1, got {self.steps}")
        if self.optimizer not in ("adam", "gradient"):
            raise ValueError(f"graph.optimizer must be 'adam' or 'gradient', got {self.optimizer!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"graph.similarity must be one of {', '.join(SIMILARITIES)}, got {self.similarity!r}")
        if self.normalise_similarity not in NORMALISATIONS:
            raise ValueError(f"graph.normalise_similarity must be one of {', '.join(NORMALISATIONS)}")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"graph.betas must be in [0, 1), got {self.betas}")


SIMILARITIES = ("cosine", "update-cosine", "update-gram")
BACKTRACKS = 30  # halvings of a projected gradient step before it is given up (2⁻³⁰ of the rate)
NORMALISATIONS = ("none", "max", "minmax")


def head_similarity(
    own: np.ndarray, other: np.ndarray, measure: str = "cosine", initial: np.ndarray | None = None
) -> float:
    """Similarity of two classifier heads' weights (classes × latent), in [−1, 1].

    - "cosine": per-class cosine of the weight rows, averaged (the MAPL paper);
    - "update-cosine": the same on the updates since the common initial head `initial`;
    - "update-gram": correlation of the two heads' class-by-class cosine matrices of their
      (class-centred) updates. It compares how a head separates classes from one another, which
      survives any rotation of the latent space, so backbones of different architectures (whose
      latent coordinates mean different things) still compare.
    A zero row has no direction and counts as cosine 0.
    """
    if own.shape != other.shape or own.ndim != 2:
        raise ValueError(f"heads must have the same (classes × latent) shape, got {own.shape} and {other.shape}")
    a = own.astype(np.float64)
    b = other.astype(np.float64)
    if measure != "cosine":
        if initial is None or initial.shape != own.shape:
            raise ValueError(f"{measure} similarity needs the common initial head of shape {own.shape}")
        a = a - initial
        b = b - initial
    if measure == "update-gram":
        ga, gb = _class_gram(a), _class_gram(b)
        off = ~np.eye(len(ga), dtype=bool)
        return _correlation(ga[off], gb[off])
    if measure not in ("cosine", "update-cosine"):
        raise ValueError(f"unknown similarity {measure!r}; choose from {', '.join(SIMILARITIES)}")
    return float(np.clip(row_cosines(a, b), -1.0, 1.0).mean())


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of `a` with the same row of `b` (0 where either is zero)."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("kd,kd->k", a, b)
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


def _class_gram(update: np.ndarray) -> np.ndarray:
    centred = update - update.mean(axis=0, keepdims=True)
    norms = np.linalg.norm(centred, axis=1, keepdims=True)
    unit = np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    return unit @ unit.T


def _correlation(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean()
    y = y - y.mean()
    scale = np.linalg.norm(x) * np.linalg.norm(y)
    return float(np.clip(x @ y / scale, -1.0, 1.0)) if scale > 0 else 0.0


def normalise_similarities(
    similarity: np.ndarray, self_index: int, how: str = "max", ceiling: float = 0.0
) -> np.ndarray:
    """Rescale the peers' similarities; a node's similarity to itself is 1.

    "max" divides by the largest magnitude (the public MAPL code divides by the maximum);
    "minmax" maps the least similar peer to 0 and the most similar to 1, so the contrast between
    peers does not depend on how similar heads are overall. `ceiling` is a peer similarity
    that counts as heard without being a candidate: the scale is at least it.
    """
    s = similarity.astype(np.float64).copy()
    peers = np.arange(s.size) != self_index
    if how == "max":
        scale = max(np.abs(s[peers]).max(initial=0.0), ceiling)
        if scale > 0:
            s[peers] /= scale
    elif how == "minmax" and peers.sum() > 1:
        low, high = s[peers].min(), max(s[peers].max(), ceiling)
        s[peers] = (s[peers] - low) / (high - low) if high > low else 1.0
    elif how not in ("none", "minmax"):
        raise ValueError(f"unknown normalisation {how!r}; choose from {', '.join(NORMALISATIONS)}")
    s[self_index] = 1.0
    return s


def _check(w: np.ndarray, similarity: np.ndarray, confidence: np.ndarray, self_index: int) -> None:
    if not (w.shape == similarity.shape == confidence.shape and w.ndim == 1):
        raise ValueError(
            f"w, similarity and confidence must be vectors of one length, got {w.shape}, "
            f"{similarity.shape}, {confidence.shape}"
        )
    if not 0 <= self_index < w.size:
        raise ValueError(f"self_index {self_index} out of range for {w.size} candidates")


def _degree(w: np.ndarray, self_index: int, self_in_degree: bool) -> float:
    """The row's weight on peers (and on the node itself, where it stands in for one)."""
    return float(w.sum() - (0.0 if self_in_degree else w[self_index]))


def cgl_loss(
    w: np.ndarray,
    similarity: np.ndarray,
    confidence: np.ndarray,
    self_index: int,
    config: GraphConfig,
    self_in_degree: bool = False,
) -> float:
    """The CGL loss of row `w`; `self_in_degree` counts the node's own weight in the degree
    (a node that stands in for a peer: GraphOptimizer.step's `stand_in`)."""
    _check(w, similarity, confidence, self_index)
    degree = _degree(w, self_index, self_in_degree)
    alignment = np.dot(confidence * -similarity, w)
    regulariser = config.l2_weight * np.linalg.norm(w) - math.log(degree + config.epsilon)
    return float(config.mu_similarity * alignment + config.mu_regulariser * regulariser)


def cgl_gradient(
    w: np.ndarray,
    similarity: np.ndarray,
    confidence: np.ndarray,
    self_index: int,
    config: GraphConfig,
    self_in_degree: bool = False,
) -> np.ndarray:
    _check(w, similarity, confidence, self_index)
    degree = _degree(w, self_index, self_in_degree)
    norm = np.linalg.norm(w)
    grad_norm = w / norm if norm > 0 else np.zeros_like(w)
    grad_degree = np.full_like(w, -1.0 / (degree + config.epsilon))
    if not self_in_degree:
        grad_degree[self_index] = 0.0
    return config.mu_similarity * confidence * -similarity + config.mu_regulariser * (
        config.l2_weight * grad_norm + grad_degree
    )


@dataclass
class GraphOptimizer:
    """Projected steps on one node's weight vector: Adam, with moments kept per candidate across
    rounds (the candidate set changes as peers come and go; moments follow the peer), or plain
    projected gradient descent.

    Adam rescales every coordinate by its own gradient history, so a consistent gradient moves
    every weight by about the learning rate whatever its size: peers whose similarities differ
    then get the same step. Projected gradient keeps the differences, and with enough steps it
    reaches the minimiser of the (convex) loss for the current similarities.
    """

    config: GraphConfig
    first_moment: dict[str, float] = field(default_factory=dict)
    second_moment: dict[str, float] = field(default_factory=dict)
    step_count: int = 0

    def step(
        self,
        candidates: list[str],
        w: np.ndarray,
        similarity: np.ndarray,
        confidence: np.ndarray,
        self_index: int,
        stand_in: float = 0.0,
    ) -> np.ndarray:
        """E_g projected Adam steps from `w`; returns the new weights (on the simplex).

        `stand_in`: the similarity of a peer the node stands in for that is no candidate (one it
        refused counts as similar as the node can be, 1); 0: none. It bounds the normalisation
        from below, and the node's own weight counts in the degree."""
        cfg = self.config
        similarity = normalise_similarities(similarity, self_index, cfg.normalise_similarity, stand_in)
        fallback = stand_in > 0
        beta1, beta2 = cfg.betas
        m = np.array([self.first_moment.get(c, 0.0) for c in candidates])
        v = np.array([self.second_moment.get(c, 0.0) for c in candidates])
        w = project_to_simplex(w)
        for _ in range(cfg.steps):
            self.step_count += 1
            grad = cgl_gradient(w, similarity, confidence, self_index, cfg, fallback)
            if cfg.optimizer == "gradient":
                w = self._descent(w, grad, similarity, confidence, self_index, fallback)
                continue
            m = beta1 * m + (1 - beta1) * grad
            v = beta2 * v + (1 - beta2) * grad * grad
            m_hat = m / (1 - beta1**self.step_count)
            v_hat = v / (1 - beta2**self.step_count)
            w = project_to_simplex(w - cfg.learning_rate * m_hat / (np.sqrt(v_hat) + 1e-8))
        self.first_moment = dict(zip(candidates, m.tolist(), strict=True))
        self.second_moment = dict(zip(candidates, v.tolist(), strict=True))
        return w

    def _descent(
        self,
        w: np.ndarray,
        grad: np.ndarray,
        similarity: np.ndarray,
        confidence: np.ndarray,
        self_index: int,
        fallback: bool,
    ) -> np.ndarray:
        """One projected gradient step that lowers the loss: the learning rate, halved until
        it does (at most BACKTRACKS times; otherwise `w` stays). A fixed step overshot where
        every peer is unlike the node: the degree term's gradient, −μ2/deg, grows without bound
        as the peers' weight nears 0, and one step then threw the whole row onto the peers,
        the node's own weight 0 (three digits nodes on a chain of class sets: a node put 0.97
        on a peer of similarity −0.5, the loss 5.1 where keeping its weight gives −4.6)."""
        cfg = self.config
        before = cgl_loss(w, similarity, confidence, self_index, cfg, fallback)
        rate = cfg.learning_rate
        for _ in range(BACKTRACKS):
            moved = project_to_simplex(w - rate * grad)
            if cgl_loss(moved, similarity, confidence, self_index, cfg, fallback) <= before:
                return moved
            rate /= 2
        return w


def l1_to_truth(w: np.ndarray, w_true: np.ndarray) -> float:
    """Mean over rows of ‖w_i − w*_i‖₁ (0 = the true graph; 2 = all weight in the wrong places)."""
    return float(np.abs(np.asarray(w) - np.asarray(w_true)).sum(axis=1).mean())


def within_cluster_mass(w: np.ndarray, clusters: np.ndarray) -> float:
    """Mean over rows of the weight a node puts on its own cluster, itself included."""
    clusters = np.asarray(clusters)
    same = clusters[:, None] == clusters[None, :]
    return float((np.asarray(w) * same).sum(axis=1).mean())


def communities(w: np.ndarray, seed: int = 0, resolution: float = 1.0) -> list[int]:
    """Louvain communities of a weight matrix, as one community number per node: the graph is
    W made symmetric, (W + Wᵀ) / 2, without self-loops; communities are numbered in the order of
    their lowest node. A node with no edge is a community of its own. A `resolution` above 1
    favours smaller communities, below 1 larger ones (networkx's modularity resolution)."""
    import networkx as nx  # here, not at the top: 12 MB that only Louvain's users (SFMTL, reports) need

    w = np.asarray(w, dtype=np.float64)
    symmetric = (w + w.T) / 2
    graph = nx.Graph()
    graph.add_nodes_from(range(len(w)))
    rows, cols = np.nonzero(np.triu(symmetric, k=1))
    graph.add_weighted_edges_from((int(i), int(j), float(symmetric[i, j])) for i, j in zip(rows, cols, strict=True))
    found = sorted(
        (sorted(part) for part in nx.community.louvain_communities(graph, seed=seed, resolution=resolution)), key=min
    )
    labels = [0] * len(w)
    for number, members in enumerate(found):
        for node in members:
            labels[node] = number
    return labels


def adjusted_rand_index(found: np.ndarray, truth: np.ndarray) -> float:
    """Agreement of two partitions of the same nodes, corrected for chance: 1 = identical,
    about 0 = no better than random (Hubert & Arabie)."""
    _, a = np.unique(np.asarray(found), return_inverse=True)
    _, b = np.unique(np.asarray(truth), return_inverse=True)
    table = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(table, (a, b), 1)

    def pairs(x: np.ndarray) -> float:
        return float((x * (x - 1) / 2).sum())

    index, rows, cols = pairs(table), pairs(table.sum(1)), pairs(table.sum(0))
    expected = rows * cols / pairs(np.array([len(a)])) if len(a) > 1 else 0.0
    best = (rows + cols) / 2
    if best == expected:  # both partitions trivial (one block, or all singletons)
        return 1.0 if (np.unique(a).size == np.unique(b).size) else 0.0
    return (index - expected) / (best - expected)
