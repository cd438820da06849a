"""SCooL's attention prior: which neighbours' models moved the way mine did.

Each model's update since the common initialisation, θ − θ_0, is summarised per layer by a fixed
count-sketch (the same hash on every node, from the shared seed; nothing of it is sent), each
layer's sketch scaled to unit length so a large layer does not drown the small ones. A small MLP
(`UpdateEncoder`) maps that signature to an embedding, and node i's prior over itself and its
neighbours is the softmax of cosine similarities with its own embedding. The encoder is trained
towards the E-step's target and gossiped (averaged with the neighbours'), where the public code
averages one global encoder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..models.device import CPU

__all__ = ["UpdateSketch", "UpdateEncoder", "attention_prior"]


class UpdateSketch:
    """Per-layer count-sketch of a model update into `width` buckets per layer."""

    def __init__(self, shapes: Mapping[str, torch.Size], width: int, seed: int, device: torch.device = CPU) -> None:
        """The hash is drawn on the CPU (the same on every node and device), then kept on `device`,
        where the updates it sketches are."""
        generator = torch.Generator().manual_seed(seed)
        self.width = width
        self.names = tuple(shapes)
        self._buckets: dict[str, torch.Tensor] = {}
        self._signs: dict[str, torch.Tensor] = {}
        for name in self.names:
            size = math.prod(shapes[name])
            self._buckets[name] = torch.randint(0, width, (size,), generator=generator).to(device)
            self._signs[name] = (torch.randint(0, 2, (size,), generator=generator).float() * 2 - 1).to(device)

    @property
    def size(self) -> int:
        return self.width * len(self.names)

    def __call__(self, state: Mapping[str, torch.Tensor], origin: Mapping[str, torch.Tensor]) -> torch.Tensor:
        parts = []
        for name in self.names:
            update = (state[name] - origin[name]).flatten().float()
            sketch = torch.zeros(self.width, device=update.device).index_add_(
                0, self._buckets[name], update * self._signs[name]
            )
            parts.append(F.normalize(sketch, dim=0))
        return torch.cat(parts)


class UpdateEncoder(nn.Module):
    def __init__(self, inputs: int, hidden: int, embedding: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, embedding))

    def forward(self, signatures: torch.Tensor) -> torch.Tensor:
        return self.net(signatures)


def attention_prior(embeddings: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax_j(cos(e_0, e_j) / τ) over the rows of `embeddings`, row 0 being the node itself.

    Cosine, not the raw dot product: with e_0 · e_0 ≥ e_0 · e_j, embeddings that grow in norm
    would hand ever more weight to the node itself, whatever the updates say."""
    unit = F.normalize(embeddings, dim=1)
    return torch.softmax(unit @ unit[0] / temperature, dim=0)
