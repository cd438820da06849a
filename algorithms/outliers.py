"""Peers' payloads far off the scale of the node's own and its neighbours': refused, and the
weight such a peer held kept by the node itself.

A poisoning peer can multiply what it sends by any factor the wire allows (the tensor norm
bound, protocol.Limits.max_tensor_norm, is 10⁶, and honest tensors are 10⁻¹–10²). Similarities
are cosines and cannot see scale, and a weighted mean of its tensors is dominated by it. Honest
nodes trained the same way publish tensors of one order of magnitude (docs/learning.md,
"Poisoning peers"), so the check is on the scale of each part of a payload (prototypes, a head,
a model's parameters, its update), against the same part of the node's own and of the neighbours
it accepted lately, on a log scale:

    refused  if  |log s − median(log s_k)| > max(log max_norm_ratio, max_deviations · 1.4826 · MAD(log s_k))

A step (SCooL's update) is judged on its own terms. Its scale follows the loss, not the
training recipe: on mnist5k (SCooL, seed 0, no poisoner) honest steps stood up to 6.7× above
and 17× below the median of the node's and its neighbours', where models stayed within 1.5×;
refusing the small ones cost SCooL its graph (BENCHMARKS.md, SCooL). A smaller step only damps
the node's own in the M-step, so a step is refused above the bound only, and its floor is
`max_step_ratio` (16) instead of `max_norm_ratio`. A poisoner scaling its whole model is
refused for the model's parameters, which spread little.

The median and the MAD (median absolute deviation; × 1.4826 it estimates a standard deviation)
ignore a minority of outliers, where a mean and a standard deviation would follow them. The
node's own scale is always among the s_k, so with few neighbours it decides; a refused payload
never joins them. The ratio is a floor: a neighbourhood whose honest scales spread more widens
the bound by its own spread.

A peer with a part refused stays distrusted until that part passes again. A distrusted peer is
absent from the node's rounds, and the weight it would hold is the node's own (`fold_into_self`,
collaboration.UniformGraph): a node that cannot trust its only cluster-mate falls back on
itself, not on strangers to its data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .interface import PayloadRejected, Scale

__all__ = [
    "OutlierConfig",
    "Scale",
    "norm",
    "row_scale",
    "state_scale",
    "scale_outlier",
    "ScaleGuard",
    "fold_into_self",
]

MAD_TO_DEVIATION = 1.4826  # MAD × this estimates the standard deviation of a normal sample


@dataclass(frozen=True)
class OutlierConfig:
    # The least factor off the median scale that is refused (either way). Honest ratios to the
    # node's own stayed within 0.64–1.58 (heads of different backbones) and 0.996–1.004
    # (prototypes) on mnist5k: 4 leaves a margin of 2.5. inf: no scale check.
    max_norm_ratio: float = 4.0
    # ... widened to this many robust deviations of the neighbourhood's log-scales: the Hampel
    # identifier's usual 3.
    max_deviations: float = 3.0
    # The least factor above the median that is refused for a step (SCooL's update), which is
    # never refused for being smaller. Honest steps stood up to 6.7× above the median on
    # mnist5k (SCooL, seed 0): 16 leaves a margin of 2.4. inf: steps go unchecked.
    max_step_ratio: float = 16.0
    # Peers that left while distrusted, remembered (the one that left first is forgotten first),
    # so that leaving wipes no distrust: see ScaleGuard.set_peers.
    remember_departed: int = 64

    def __post_init__(self) -> None:
        for name in ("max_norm_ratio", "max_step_ratio"):
            if not getattr(self, name) > 1:
                raise ValueError(f"outliers.{name} must be > 1 (inf: no bound), got {getattr(self, name)}")
        if not self.max_deviations >= 0:
            raise ValueError(f"outliers.max_deviations must be ≥ 0, got {self.max_deviations}")
        if not (isinstance(self.remember_departed, int) and self.remember_departed >= 0):
            raise ValueError(f"outliers.remember_departed must be an integer ≥ 0, got {self.remember_departed!r}")


def norm(array: np.ndarray) -> float:
    """L2 norm, in float64 whatever the encoding."""
    return float(np.linalg.norm(np.asarray(array, dtype=np.float64)))


def row_scale(rows: np.ndarray) -> float:
    """Root mean square of a matrix's row norms: the scale of prototypes, whatever the number
    of classes a node holds."""
    return norm(rows) / math.sqrt(max(1, len(rows)))


def state_scale(tensors: Mapping[str, np.ndarray] | Iterable[np.ndarray]) -> float:
    """L2 norm of a model's floating-point tensors together (integer counters are not scale)."""
    arrays = tensors.values() if isinstance(tensors, Mapping) else tensors
    squares = sum(norm(a) ** 2 for a in arrays if np.asarray(a).dtype.kind == "f")
    return math.sqrt(squares)


def scale_outlier(
    scale: float, reference: Sequence[float], config: OutlierConfig, step: bool = False, ratio: float | None = None
) -> str | None:
    """Why `scale` is an outlier among `reference` (the node's own first, then its neighbours'),
    or None if it is not; a `step` is one only above the bound; `ratio` replaces the config's
    for a part whose scale is fixed by design. Scales of zero (nothing trained yet) are no
    reference."""
    if ratio is None:
        ratio = config.max_step_ratio if step else config.max_norm_ratio
    known = np.log([s for s in reference if s > 0 and math.isfinite(s)])
    if not known.size or math.isinf(ratio):
        return None
    centre = float(np.median(known))
    spread = MAD_TO_DEVIATION * float(np.median(np.abs(known - centre)))
    bound = max(math.log(ratio), config.max_deviations * spread)
    off = math.log(scale) - centre if scale > 0 else -math.inf
    if (off if step else abs(off)) <= bound:
        return None
    return f"scale {scale:.3g}, median {math.exp(centre):.3g} over this node and {known.size - 1} neighbour(s)"


class ScaleGuard:
    """One node's check of its peers' payloads against its own and its neighbourhood's scale,
    and the peers it distrusts for a refusal. Bounded: one scale per (peer, part) of the current
    peers, and at most `remember_departed` peers that left distrusted."""

    def __init__(self, config: OutlierConfig, window: int) -> None:
        if window < 0:
            raise ValueError(f"window must be ≥ 0, got {window}")
        self.config = config
        self.window = window  # rounds a neighbour's accepted scale stays a reference
        self.peers: frozenset[str] = frozenset()
        self._accepted: dict[tuple[str, str], tuple[int, float]] = {}  # (peer, part) → (round, scale)
        self._refused: dict[str, set[str]] = {}  # peer → parts refused and not accepted since
        self._departed: dict[str, set[str]] = {}  # the same, of peers that left; the earliest first

    def set_peers(self, peers: Iterable[str]) -> None:
        """A peer that leaves while distrusted stays distrusted: one that comes back is so until
        its payloads pass again, and a learned row goes on standing in for it. Forgotten, its
        leaving (or its eviction, the node too busy to hear it) handed the node whose only
        cluster-mate it was to strangers: the `max` normalisation made the best of them look as
        similar as the node itself (digits, 4 daemons under load: 0.36 / 0.33 / 0.31 of a row)."""
        self.peers = frozenset(peers)
        self._accepted = {key: value for key, value in self._accepted.items() if key[0] in self.peers}
        for peer in [peer for peer in self._refused if peer not in self.peers]:
            self._departed.pop(peer, None)
            self._departed[peer] = self._refused.pop(peer)
        for peer in [peer for peer in self._departed if peer in self.peers]:
            self._refused[peer] = self._departed.pop(peer)
        while len(self._departed) > self.config.remember_departed:
            del self._departed[next(iter(self._departed))]

    def _heard(self, part: str, round: int, sender: str) -> list[float]:
        return [
            scale
            for (peer, name), (r, scale) in self._accepted.items()
            if name == part and peer != sender and abs(round - r) <= self.window
        ]

    def check(self, peer: str, round: int, parts: Mapping[str, Scale]) -> None:
        """`parts`: name → its Scale. Raises PayloadRejected (`out_of_scale`) at the first
        outlier; otherwise the scales join the reference, and the peer is no longer distrusted
        for these parts."""
        for part, (theirs, own, step, ratio) in parts.items():
            why = scale_outlier(theirs, [own, *self._heard(part, round, peer)], self.config, step, ratio)
            if why is not None:
                self.refuse(peer, part)
                raise PayloadRejected("out_of_scale", f"{part}: {why}")
        if peer not in self.peers:
            return
        for part, scale in parts.items():
            self._accepted[(peer, part)] = (round, scale.theirs)
        left = self._refused.get(peer, set()) - parts.keys()
        if left:
            self._refused[peer] = left
        else:
            self._refused.pop(peer, None)

    def refuse(self, peer: str, part: str) -> None:
        """`peer`'s payload was refused for what `part` holds (its scale, or its form): the peer
        is distrusted until that part passes again."""
        if peer in self.peers:
            self._refused.setdefault(peer, set()).add(part)

    @contextmanager
    def judging(self, peer: str, part: str) -> Iterator[None]:
        """Checks of a payload's content: any refusal inside distrusts `peer` for `part`."""
        try:
            yield
        except PayloadRejected:
            self.refuse(peer, part)
            raise

    def distrusted(self) -> frozenset[str]:
        """Peers with a part refused and not accepted since, those that left so included."""
        return frozenset(self._refused) | frozenset(self._departed)


def fold_into_self(row: Mapping[str, float], node_id: str, distrusted: Iterable[str]) -> dict[str, float]:
    """`row` with the weight of each distrusted peer moved onto the node itself."""
    out = dict(row)
    freed = sum(out.pop(peer, 0.0) for peer in set(distrusted) - {node_id})
    out[node_id] = out.get(node_id, 0.0) + freed
    return out
