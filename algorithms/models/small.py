"""The small homogeneous model that heterogeneous nodes share: one part, used by MAPL-Dual and
FedMRL.

Every node builds the same `SmallModel` from the network's shared seed, so parameters compare
and average across nodes whatever each node's own backbone. What travels, as one MODEL payload:

- the small backbone's floating-point state (parameters and BatchNorm statistics), which is
  mixed with the node's collaboration weights;
- the small head's weight, which is *not* mixed: it stays personal and is the graph's evidence.
  Its update since the common start reflects only the node's own data (on features every node
  shares), so mixing cannot blur it: if the heads were averaged, the heads of a neighbourhood
  would agree because they were averaged, not because their data do.

`encoding` trades accuracy for bytes: "float32" as trained, or "float16", half the bytes (a
tensor with a value beyond float16's range goes as float32 instead of overflowing).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from protocol.messages import Model

from ..graphs.graph import head_similarity
from ..interface import NodeSetup
from ..payloads import ENCODINGS, SharedModules, check_model, encode_state, state_norm, to_numpy
from .personal import SmallModel

__all__ = ["HEAD_KEY", "SmallShare", "shared_small_model"]

HEAD_KEY = "head.weight"


def shared_small_model(setup: NodeSetup, latent_dim: int) -> SmallModel:
    """The small model, initialised from the network's shared seed (on the CPU: the same on
    every node, whatever its device), on the node's device. The global torch RNG is left as it was."""
    data = setup.data
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(setup.shared_seed)
        model = SmallModel(tuple(data.train_images.shape[1:]), data.num_classes, latent_dim)
    return model.to(setup.device)


class SmallShare:
    """The small model on the wire: its body, the checks on a peer's, mixing, and head similarity."""

    def __init__(self, model: SmallModel, encoding: str = "float32") -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; choose from {', '.join(ENCODINGS)}")
        self.model = model
        self.encoding = encoding
        self.mixed = SharedModules({"backbone": model.backbone})
        self.initial_head = to_numpy(model.head.weight)

    def _state(self) -> dict[str, torch.Tensor]:
        return {**self.mixed.state(), HEAD_KEY: self.model.head.weight}

    def body(self) -> Model:
        return Model(kind="params", tensors=encode_state(self._state(), self.encoding))

    def check(self, body: Model) -> None:
        """Raises PayloadRejected unless `body` is a small model of exactly our shapes."""
        check_model(body, self._state())

    def scale(self) -> float:
        """The norm of the parameters `body` sends (SharedModules.scale)."""
        return state_norm(self.mixed.parameters(self._state()))

    def scale_of(self, tensors: Mapping[str, np.ndarray]) -> float:
        """The norm of a peer's parameters (SharedModules.scale_of)."""
        return self.mixed.scale_of(tensors)

    def mix(self, own_weight: float, others: list[tuple[float, Model]]) -> None:
        """backbone ← own_weight · backbone + Σ weight · peer's backbone; the head stays."""
        self.mixed.mix(own_weight, others)

    def similarity(self, body: Model, measure: str) -> float:
        """How alike a peer's head update and ours are, since the common start (graph.py)."""
        return head_similarity(
            to_numpy(self.model.head.weight),
            np.asarray(body.tensors[HEAD_KEY], dtype=np.float32),
            measure,
            self.initial_head,
        )
