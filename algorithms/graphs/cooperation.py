"""SCooL's E-step over one node's view: from cross-client log-likelihoods to a row of W.

Pure numpy, one node's row at a time, so it runs decentralised: node i knows only
y_j = log P(D_j | θ_i) per sample (its own score first, then what its neighbours answered) and,
for the SBM prior, the block memberships its neighbours published.

- SBM prior: q_ij = sigmoid((y_j + prior_ij) / T) with prior_ij = Ω_iᵀ logit(B) Ω_j, the log-odds
  the block model gives the edge; Ω_i is then re-estimated from the edges (mean field), and the
  two alternate for a few sweeps. W's row is q normalised.
- Attention prior: w = normalise(softmax(y / T) ⊙ p) with p the attention over the neighbours'
  update embeddings (algorithms/graphs/attention.py).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "sigmoid",
    "softmax",
    "row_normalise",
    "block_matrix",
    "sbm_edge_logits",
    "sbm_membership",
    "sbm_e_step",
    "sbm_blocks_m_step",
    "attention_weights",
    "keep_top",
]

_TINY = 1e-12


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflow


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    z = np.exp(x - x.max())
    return z / z.sum()


def row_normalise(values: np.ndarray) -> np.ndarray:
    """values / Σ values; uniform when they sum to (nearly) zero."""
    values = np.asarray(values, dtype=np.float64)
    total = values.sum()
    if not total > _TINY:
        return np.full(len(values), 1.0 / len(values))
    return values / total


def block_matrix(blocks: int, within: float, between: float) -> np.ndarray:
    """B with `within` on the diagonal and `between` elsewhere (the public code: 0.8 / 0.2)."""
    matrix = np.full((blocks, blocks), between, dtype=np.float64)
    np.fill_diagonal(matrix, within)
    return matrix


def sbm_edge_logits(own: np.ndarray, others: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """prior_j = Ω_iᵀ logit(B) Ω_j for each row Ω_j of `others`."""
    logit = np.log(blocks) - np.log1p(-blocks)
    return others @ (logit.T @ own)


def sbm_membership(edges: np.ndarray, others: np.ndarray, blocks: np.ndarray, proportions: np.ndarray) -> np.ndarray:
    """Mean-field update of Ω_i from its edge probabilities q_ij to the nodes with memberships Ω_j:
    Ω_ik ∝ α_k exp Σ_j Σ_l Ω_jl (q_ij log B_kl + (1 − q_ij) log(1 − B_kl))."""
    evidence = np.log(blocks) @ (others.T @ edges) + np.log1p(-blocks) @ (others.T @ (1.0 - edges))
    return softmax(np.log(np.maximum(proportions, _TINY)) + evidence)


def sbm_e_step(
    log_likelihood: np.ndarray,
    own: np.ndarray,
    others: np.ndarray,
    blocks: np.ndarray,
    proportions: np.ndarray,
    temperature: float,
    sweeps: int,
    damping: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One node's E-step under the SBM prior.

    `log_likelihood[0]` is the node's own score, `log_likelihood[1:]` its neighbours' (per
    sample); `others` holds those neighbours' memberships, row for row. Returns the edge
    probabilities q (self first) and the node's new membership Ω_i.

    `damping` keeps that share of the old Ω_i at each sweep. Every node updates at once from
    memberships its neighbours published a round earlier; undamped, non-edges (most pairs)
    push all nodes to the block the others just left, and the whole network flips every round.
    """
    if len(log_likelihood) != len(others) + 1:
        raise ValueError(f"{len(log_likelihood)} scores for {len(others)} neighbours and self")
    y = np.asarray(log_likelihood, dtype=np.float64)
    for _ in range(max(1, sweeps)):
        prior = np.concatenate([sbm_edge_logits(own, own[None, :], blocks), sbm_edge_logits(own, others, blocks)])
        edges = sigmoid((y + prior) / temperature)
        if len(others):
            own = damping * own + (1.0 - damping) * sbm_membership(edges[1:], others, blocks, proportions)
    return edges, own


def sbm_blocks_m_step(
    edges: np.ndarray, own: np.ndarray, others: np.ndarray, blocks: np.ndarray, strength: float
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's M-step for B and α, estimated from this node's own edges only and shrunk
    towards the current B by `strength` pseudo-edges per block pair (one node sees few edges).

    B_kl ← (Σ_j Ω_ik Ω_jl q_ij + s B_kl) / (Σ_j Ω_ik Ω_jl + s), symmetrised and kept in
    [0.01, 0.99]; α ← the mean membership of the node and its neighbours."""
    pair = np.outer(own, others.sum(0)) if len(others) else np.zeros_like(blocks)
    linked = np.outer(own, others.T @ edges[1:]) if len(others) else np.zeros_like(blocks)
    updated = (linked + strength * blocks) / (pair + strength)
    updated = np.clip((updated + updated.T) / 2, 0.01, 0.99)
    proportions = np.vstack([own[None, :], others]).mean(0)
    return updated, proportions


def attention_weights(log_likelihood: np.ndarray, attention: np.ndarray, temperature: float) -> np.ndarray:
    """w = normalise(softmax(y / T) ⊙ p), self first."""
    if len(log_likelihood) != len(attention):
        raise ValueError(f"{len(log_likelihood)} scores but {len(attention)} attention weights")
    return row_normalise(softmax(np.asarray(log_likelihood, dtype=np.float64) / temperature) * attention)


def keep_top(weights: dict[str, float], peers: int, fraction: float) -> tuple[str, ...]:
    """The ⌊fraction · peers⌋ (at least one) heaviest neighbours; ties broken by id."""
    count = max(1, math.floor(fraction * peers + 1e-9))
    ranked = sorted(weights.items(), key=lambda item: (-item[1], item[0]))
    return tuple(sorted(peer for peer, _ in ranked[:count]))
