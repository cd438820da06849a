"""SCooL's priors over the cooperation graph: what turns scores into one node's row of W.

Each prior adds what it needs to the node's MODEL payload (`extras`), checks that part of a
peer's payload (`check`), and runs the node's E-step (`weights`) from the log-likelihood scores
(own first, then the cooperating neighbours') and those neighbours' models.

- `SbmPrior`: a stochastic block model. K blocks, the node's membership Ω (published with the
  model), the block matrix B (fixed, or learned from the node's own edges).
- `AttentionPrior`: an encoder of each model's update since θ_0 (algorithms/graphs/attention.py),
  trained towards the likelihood's verdict and gossiped with the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from protocol.messages import Model

from ..interface import PayloadRejected
from ..payloads import average_states, to_numpy
from .attention import UpdateEncoder, UpdateSketch, attention_prior
from .cooperation import attention_weights, block_matrix, row_normalise, sbm_blocks_m_step, sbm_e_step, softmax

__all__ = ["SbmPrior", "AttentionPrior", "MEMBERSHIP", "ENCODER"]

MEMBERSHIP = "scool.membership"  # the SBM membership Ω_i, sent with the model
ENCODER = "encoder."  # prefix of the attention encoder's parameters, sent with the model


class SbmPrior:
    def __init__(self, config: Any, seed: int) -> None:
        self.config = config
        # A random start breaks the symmetry between blocks (uniform memberships never move).
        self.membership = np.random.default_rng(seed).dirichlet(np.ones(config.blocks))
        self.blocks = block_matrix(config.blocks, config.block_within, config.block_between)
        self.proportions = np.full(config.blocks, 1.0 / config.blocks)

    def extras(self) -> dict[str, np.ndarray]:
        return {MEMBERSHIP: self.membership.astype(np.float32)}

    def check(self, body: Model) -> None:
        membership = body.tensors[MEMBERSHIP]
        if (membership < 0).any() or not abs(float(membership.sum()) - 1.0) < 1e-3:
            raise PayloadRejected("bad_membership", f"block memberships {membership.tolist()} are not a distribution")

    def weights(self, scores: np.ndarray, models: list[Model], own: Mapping[str, torch.Tensor]) -> np.ndarray:
        cfg = self.config
        others = np.array([body.tensors[MEMBERSHIP] for body in models], dtype=np.float64).reshape(-1, cfg.blocks)
        edges, self.membership = sbm_e_step(
            scores,
            self.membership,
            others,
            self.blocks,
            self.proportions,
            cfg.temperature,
            cfg.e_sweeps,
            cfg.membership_damping,
        )
        if cfg.learn_blocks:
            self.blocks, self.proportions = sbm_blocks_m_step(
                edges, self.membership, others, self.blocks, cfg.block_strength
            )
        return row_normalise(edges)

    def state_dict(self) -> dict[str, Any]:
        return {
            "membership": torch.tensor(self.membership),
            "blocks": torch.tensor(self.blocks),
            "proportions": torch.tensor(self.proportions),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            membership, blocks = state["membership"].cpu().numpy(), state["blocks"].cpu().numpy()
            proportions = state["proportions"].cpu().numpy()
        except (KeyError, AttributeError) as exc:
            raise ValueError(f"the saved SBM state does not fit: {exc}") from None
        if membership.shape != self.membership.shape or blocks.shape != self.blocks.shape:
            raise ValueError(f"the saved SBM state has {membership.shape[0]} blocks, this node {self.config.blocks}")
        self.membership, self.blocks, self.proportions = membership, blocks, proportions


class AttentionPrior:
    def __init__(self, config: Any, origin: Mapping[str, torch.Tensor], parameters: frozenset[str], seed: int) -> None:
        """`origin` is θ_0 (the state every update is measured from), `parameters` the names in
        it that are trained (the sketch covers those), `seed` the network's shared seed."""
        self.config = config
        self.origin = {name: tensor.clone() for name, tensor in origin.items()}
        shapes = {name: tensor.shape for name, tensor in origin.items() if name in parameters}
        self.device = device = next(iter(origin.values())).device  # the model's: the prior runs beside it
        self.sketch = UpdateSketch(shapes, config.sketch_width, seed=seed, device=device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            encoder = UpdateEncoder(self.sketch.size, config.encoder_hidden, config.encoder_dim)
        self.encoder = encoder.to(device)  # initialised on the CPU: the same on every node and device
        self.optimizer = torch.optim.Adam(self.encoder.parameters(), lr=config.encoder_learning_rate)

    def extras(self) -> dict[str, np.ndarray]:
        return {ENCODER + name: to_numpy(p) for name, p in self.encoder.state_dict().items()}

    def check(self, body: Model) -> None:
        """The encoder's tensors were checked with the rest of the model's names and shapes."""

    def weights(self, scores: np.ndarray, models: list[Model], own: Mapping[str, torch.Tensor]) -> np.ndarray:
        cfg = self.config
        theirs = [
            self.sketch({n: torch.tensor(body.tensors[n], device=self.device) for n in self.sketch.names}, self.origin)
            for body in models
        ]
        signatures = torch.stack([self.sketch(own, self.origin), *theirs])
        with torch.no_grad():
            prior = attention_prior(self.encoder(signatures), cfg.attention_temperature).double().cpu().numpy()
        weights = attention_weights(scores, prior, cfg.temperature)
        # The encoder learns to predict the likelihood's own verdict, softmax(y / T). Trained
        # towards w itself (which contains p), any p would be its own fixed point: no signal.
        target = torch.tensor(softmax(scores / cfg.temperature), dtype=torch.float32, device=self.device)
        for _ in range(cfg.encoder_steps):
            p = attention_prior(self.encoder(signatures), cfg.attention_temperature)
            loss = -(target * torch.log(p + 1e-12)).sum()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self._gossip(models)
        return weights

    @torch.no_grad()
    def _gossip(self, models: list[Model]) -> None:
        share = 1.0 / (len(models) + 1)
        theirs = [
            (share, {name[len(ENCODER) :]: t for name, t in body.tensors.items() if name.startswith(ENCODER)})
            for body in models
        ]
        average_states(self.encoder.state_dict(), share, theirs)

    def state_dict(self) -> dict[str, Any]:
        return {"encoder": self.encoder.state_dict(), "encoder_optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            self.encoder.load_state_dict(state["encoder"])
            self.optimizer.load_state_dict(state["encoder_optimizer"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ValueError(f"the saved attention encoder does not fit: {exc}") from None
