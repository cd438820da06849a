"""SCooL (Li, Zhou, Tian & Tao, ICML 2023): structured cooperative learning, decentralised.

One model per node, one architecture everywhere, one common initialisation θ_0. A round:

1. local step: E epochs of cross-entropy from θ_i^start; Δ_i = θ_i^start − θ_i.
2. publish MODEL(θ_i, update=Δ_i) to the neighbours (everyone, until the graph is pruned).
3. every node that receives θ_i answers with a SCORE: log P(D_j | θ_i), the log-likelihood of θ_i
   on a batch of j's own training data (the E-step input), naming the frame it scored.
4. end of round, E-step over node i's view: its row w_i from its own score and its
   neighbours' answers, under the prior (SBM: block memberships the neighbours publish with their
   model; attention: an encoder of the models' updates, gossiped); M-step:
   θ_i ← θ_i^start − Σ_j w_ij Δ_j (the paper's first-order stand-in for j's gradient at θ_i).
5. at round R_fix, each node keeps only its top fraction of neighbours and stops talking to the
   rest; a peer that still sends it a model (it kept this node) is answered and sent to in return.

SCooL-Dirac is D-PSGD: the graph is fixed (uniform over the peers), no scores are exchanged,
and the models are mixed: θ_i ← Σ_j w_ij θ_j. With a common start, that equals the M-step above
(tests/test_scool.py checks it). SCooL-Local trains the same model alone: the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from protocol.identity import node_id as node_id_of
from protocol.messages import Body, MessageType, Model, Score

from .attention import UpdateEncoder, UpdateSketch, attention_prior
from .cooperation import (
    attention_weights,
    block_matrix,
    keep_top,
    row_normalise,
    sbm_blocks_m_step,
    sbm_e_step,
    softmax,
)
from .models import ModelSpec, make_model
from .payloads import average_states, check_model, shared_state, to_numpy
from .seam import Algorithm, Frame, LocalReport, NodeSetup, Outbound, PayloadRejected
from .training import LocalTrainer, TrainedLocally, TrainingConfig, seeded_generator

__all__ = ["ScoolConfig", "ScoolDirac", "ScoolSbm", "ScoolAttention", "ScoolLocal"]

MEMBERSHIP = "scool.membership"  # the SBM membership Ω_i, sent with the model
ENCODER = "encoder."  # prefix of the attention encoder's parameters, sent with the model
HISTORY = 3  # rounds of sent-model records and scores kept (bounded state)


@dataclass(frozen=True)
class ScoolConfig:
    """Settings of all three SCooL variants; each uses the ones of its prior."""

    training: TrainingConfig = field(
        default_factory=lambda: TrainingConfig(
            local_epochs=3, batch_size=10, optimizer="sgd", learning_rate=0.05, momentum=0.5
        )
    )
    latent_dim: int = 128
    score_samples: int = 32  # samples in the batch a peer's model is scored on (public code: 10)
    # T in sigmoid((y + prior)/T) and softmax(y/T), y per sample. At 1 a node that fits its own
    # batch a little better than its partner's locks onto itself (attention: w_ii → 1 in one
    # seed of three); 3 keeps same-group peers level (BENCHMARKS.md has the sweep).
    temperature: float = 3.0
    max_staleness: int = 1  # rounds a neighbour's model (and update) stays usable, once
    m_step: str = "updates"  # "updates": θ_start − Σ w Δ (the paper); "mixing": Σ w θ_j (D-PSGD's form)
    prune_round: int = 10  # R_fix: keep only the top neighbours from this round on (0: never)
    keep_fraction: float = 0.2  # ... this fraction of the peers, at least one (paper 0.1, code 0.1–0.2)
    # SBM prior
    blocks: int = 2  # K
    block_within: float = 0.8  # B's diagonal (the public code keeps B fixed at 0.8 / 0.2) ...
    block_between: float = 0.2
    learn_blocks: bool = False  # ... True: the paper's M-step for B and α, from the node's own edges
    block_strength: float = 5.0  # pseudo-edges per block pair that keep a learned B near the last one
    e_sweeps: int = 2  # alternations of edge and membership updates per round
    membership_damping: float = 0.5  # share of the old Ω kept per sweep (0: the public code's jump)
    # attention prior
    sketch_width: int = 16  # sketch buckets per layer of the update signature
    encoder_hidden: int = 64
    encoder_dim: int = 32
    encoder_steps: int = 5  # Adam steps per round towards the E-step's target
    encoder_learning_rate: float = 1e-2
    attention_temperature: float = 1.0  # τ of the softmax over embedding cosines

    def __post_init__(self) -> None:
        positive = (
            "latent_dim",
            "score_samples",
            "blocks",
            "e_sweeps",
            "sketch_width",
            "encoder_hidden",
            "encoder_dim",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.max_staleness < 0 or self.prune_round < 0 or self.encoder_steps < 0:
            raise ValueError("max_staleness, prune_round and encoder_steps must be ≥ 0")
        if self.m_step not in ("updates", "mixing"):
            raise ValueError(f"m_step must be 'updates' or 'mixing', got {self.m_step!r}")
        if not 0 <= self.membership_damping < 1:
            raise ValueError(f"membership_damping must be in [0, 1), got {self.membership_damping}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {self.keep_fraction}")
        if not 0 < self.block_between < 1 or not 0 < self.block_within < 1:
            raise ValueError("block_within and block_between must be in (0, 1)")
        if not (self.block_strength > 0 and self.encoder_learning_rate > 0 and self.attention_temperature > 0):
            raise ValueError("block_strength, encoder_learning_rate and attention_temperature must be > 0")


class _Scool(TrainedLocally, Algorithm):
    homogeneous = True
    config_type = ScoolConfig
    waits_for = frozenset({MessageType.MODEL, MessageType.SCORE})
    uses_updates: ClassVar[bool] = True  # the M-step applies neighbours' Δ_j (Dirac mixes θ_j)

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or ScoolConfig()
        self.data = data = setup.data
        self.spec = ModelSpec(
            backbone=setup.backbone,
            image_shape=tuple(data.train_images.shape[1:]),
            num_classes=data.num_classes,
            latent_dim=config.latent_dim,
            projection_dim=1,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(setup.shared_seed)  # θ_0: the same on every node
            self.model = make_model(self.spec)
        self.scratch = make_model(self.spec)  # where a peer's parameters are loaded to be scored
        self.origin = {name: tensor.clone() for name, tensor in self._state().items()}
        # Parameters move by the neighbours' updates; BatchNorm statistics are mixed instead
        # (start − Σ w Δ of a running variance can go negative; a convex mix cannot).
        self.parameter_names = frozenset(
            f"{prefix}.{name}"
            for prefix, module in (("backbone", self.model.backbone), ("head", self.model.head))
            for name, _ in module.named_parameters()
        )
        self.trainer = LocalTrainer(
            self.model, data.train_images, data.train_labels, config.training, seeded_generator(setup.seed, 1)
        )
        self.round = 0
        self.start: dict[str, torch.Tensor] = {}  # θ_i^start of the round in progress
        self.update: dict[str, torch.Tensor] = {}  # Δ_i of the round in progress
        self.own_score = 0.0  # log P(D_i | θ_i) per sample, this round
        self.neighbours: tuple[str, ...] | None = None  # None until pruned: everyone
        self.audience: set[str] = set()  # peers that kept this node after pruning: they get its model
        self.row: dict[str, float] = {}
        # What arrived: latest model per peer (round, body, used by an M-step yet), scores per round.
        self.models: dict[str, tuple[int, Model, bool]] = {}
        self.scores: dict[int, dict[str, float]] = {}
        self.own_models: dict[int, Model] = {}  # what this node published, by round
        self.sent: dict[int, dict[int, frozenset[str]]] = {}  # round → frame seq → peers it went to
        self.pending: list[tuple[str, int, Frame, Model]] = []  # models owed a SCORE
        self._batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # --- model state ---------------------------------------------------------------------

    def _state(self) -> dict[str, torch.Tensor]:
        return shared_state({"backbone": self.model.backbone, "head": self.model.head})

    def _extras(self) -> dict[str, np.ndarray]:
        """What the prior adds to the MODEL map."""
        return {}

    def _check_model(self, body: Model) -> None:
        check_model(body, {**self._state(), **self._extras()})
        if self.uses_updates and (body.update is None or body.update.keys() != self.parameter_names):
            raise PayloadRejected("bad_shape", "the model's update must cover every parameter, and only those")

    # --- the round -----------------------------------------------------------------------

    def _loss(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        loss = F.cross_entropy(self.model.classify(images), labels)
        return loss, {"cross_entropy": loss.item()}

    def local_step(self, round: int) -> LocalReport:
        self.round = round
        self.start = {name: tensor.clone() for name, tensor in self._state().items()}
        report = self.trainer.run(self._loss)
        self.update = {
            name: self.start[name] - tensor for name, tensor in self._state().items() if name in self.parameter_names
        }
        self.own_score = self._log_likelihood(self.model, round) / self._score_batch(round)[1].numel()
        return report

    def _targets(self) -> tuple[str, ...]:
        if self.neighbours is None:
            return self.peers
        return tuple(sorted((set(self.neighbours) | self.audience) & set(self.peers)))

    def publish(self, round: int) -> list[Outbound]:
        to = self._targets()
        if not to:
            return []
        tensors = {name: to_numpy(t) for name, t in self._state().items()} | self._extras()
        update = {name: to_numpy(t) for name, t in self.update.items()} if self.uses_updates else None
        self.own_models[round] = Model(kind="params", tensors=tensors, update=update)
        return [Outbound(to=to, body=self.own_models[round])]

    def published(self, round: int, out: Outbound, seq: int) -> None:
        if isinstance(out.body, Model):
            self.sent.setdefault(round, {})[seq] = frozenset(out.to)

    def receive(self, peer: str, round: int, body: Body, frame: Frame | None = None) -> None:
        if peer not in self.peers:
            raise PayloadRejected("not_a_peer", f"{peer} is not among this node's peers")
        if (
            isinstance(body, Model)
            and self.neighbours is not None
            and peer not in self.neighbours
            and round >= self.config.prune_round
        ):
            self.audience.add(peer)  # it kept this node (even if its model is late): answer with ours
        if round < self.round - self.config.max_staleness:
            raise PayloadRejected("stale", f"{body.TYPE.value} for round {round}, this node is at {self.round}")
        if isinstance(body, Model):
            self._receive_model(peer, round, body, frame)
        elif isinstance(body, Score) and self.waits_for >= {MessageType.SCORE}:
            self._receive_score(peer, round, body)
        else:
            raise PayloadRejected("unexpected_type", f"{self.name} takes no {body.TYPE.value} payloads")

    def _receive_model(self, peer: str, round: int, body: Model, frame: Frame | None) -> None:
        held = self.models.get(peer)
        if held is not None and held[0] >= round:
            raise PayloadRejected("duplicate_model", f"a model for round {round} from {peer} is already held")
        self._check_model(body)
        self.models[peer] = (round, body, False)
        if MessageType.SCORE in self.waits_for and frame is not None:
            self.pending.append((peer, round, frame, body))

    def _receive_score(self, peer: str, round: int, body: Score) -> None:
        if body.kind != "log_likelihood":
            raise PayloadRejected("bad_kind", f"expected a log_likelihood score, got {body.kind}")
        if node_id_of(body.subject) != self.node_id:
            raise PayloadRejected("wrong_subject", "the score is about another node's model")
        if peer not in self.sent.get(round, {}).get(body.subject_seq, ()):
            raise PayloadRejected(
                "unsolicited_score", f"no model of round {round} in frame {body.subject_seq} was sent to {peer}"
            )
        if peer in self.scores.get(round, {}):
            raise PayloadRejected("duplicate_score", f"{peer} already scored the model of round {round}")
        if body.samples < 1 or body.value > 1e-6:
            raise PayloadRejected("bad_score", f"log-likelihood {body.value} over {body.samples} samples")
        self.scores.setdefault(round, {})[peer] = body.value / body.samples

    def respond(self) -> list[Outbound]:
        """Score each model received since the last call on this node's own data; a peer that
        sent its model without getting ours (it kept this node at pruning, we did not keep it)
        gets ours too, so that its round completes without waiting for its deadline."""
        pending, self.pending = self.pending, []
        answers = []
        for peer, round, frame, body in pending:
            sent_to = set().union(*self.sent.get(round, {}).values())
            if peer not in sent_to and round in self.own_models:
                answers.append(Outbound(to=(peer,), body=self.own_models[round], round=round))
            for name, tensor in shared_state({"backbone": self.scratch.backbone, "head": self.scratch.head}).items():
                tensor.copy_(torch.tensor(body.tensors[name], dtype=tensor.dtype))  # wire arrays are read-only
            value = self._log_likelihood(self.scratch, round)
            score = Score(
                kind="log_likelihood",
                subject=frame.sender_key,
                subject_seq=frame.seq,
                value=value,
                samples=int(self._score_batch(round)[1].numel()),
            )
            answers.append(Outbound(to=(peer,), body=score, round=round))
        return answers

    def _score_batch(self, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's scoring batch of this node's training data: the same for every model scored
        this round, so the scores compare."""
        if round not in self._batches:
            count = min(self.config.score_samples, len(self.data.train_labels))
            chosen = torch.randperm(len(self.data.train_labels), generator=seeded_generator(self.setup.seed, 2, round))
            self._batches = {r: b for r, b in self._batches.items() if r > round - HISTORY}
            self._batches[round] = (self.data.train_images[chosen[:count]], self.data.train_labels[chosen[:count]])
        return self._batches[round]

    @torch.no_grad()
    def _log_likelihood(self, model, round: int) -> float:
        images, labels = self._score_batch(round)
        was_training = model.training
        model.eval()
        value = -F.cross_entropy(model.classify(images), labels, reduction="sum").item()
        model.train(was_training)
        # At most 100 nats per sample: a broken model (non-finite logits) scores as the worst,
        # and the SCORE stays finite, as the protocol requires.
        floor = -100.0 * len(labels)
        return min(max(value, floor), 0.0) if math.isfinite(value) else floor

    def expected(self, round: int) -> tuple[str, ...]:
        if round == 0:
            return self.peers
        recent = {peer for peer, (r, _, _) in self.models.items() if r >= round - 1}
        if self.neighbours is not None:
            recent &= set(self.neighbours)
        return tuple(sorted(recent & set(self.peers)))

    def _fresh(self, round: int) -> dict[str, Model]:
        """Neighbours' models of this round (or a little older) not yet used by an M-step."""
        allowed = set(self.peers) if self.neighbours is None else set(self.neighbours)
        return {
            peer: body
            for peer, (r, body, used) in sorted(self.models.items())
            if peer in allowed and not used and 0 <= round - r <= self.config.max_staleness
        }

    def end_round(self, round: int) -> None:
        fresh = self._fresh(round)
        scores = self.scores.get(round, {})
        cooperating = [peer for peer in fresh if peer in scores]
        self.missing.update({p: self.missing.get(p, 0) + 1 for p in self._expected_now(round) if p not in cooperating})
        weights = self._e_step(
            round,
            cooperating,
            [fresh[p] for p in cooperating],
            np.array([self.own_score] + [scores[p] for p in cooperating]),
        )
        self.row = {self.node_id: float(weights[0]), **{p: float(w) for p, w in zip(cooperating, weights[1:])}}
        self._m_step(weights, [fresh[p] for p in cooperating])
        self._mark_used(cooperating)
        if self.neighbours is None and self.config.prune_round and round + 1 >= self.config.prune_round:
            self.neighbours = keep_top(
                {p: w for p, w in self.row.items() if p != self.node_id}, len(self.peers), self.config.keep_fraction
            )
        self.scores = {r: s for r, s in self.scores.items() if r > round - HISTORY}
        self.sent = {r: s for r, s in self.sent.items() if r > round - HISTORY}
        self.own_models = {r: m for r, m in self.own_models.items() if r > round - HISTORY}

    def _expected_now(self, round: int) -> set[str]:
        allowed = set(self.peers) if self.neighbours is None else set(self.neighbours)
        return allowed & set(self.peers)

    def _e_step(self, round: int, peers: list[str], models: list[Model], scores: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @torch.no_grad()
    def _m_step(self, weights: np.ndarray, models: list[Model]) -> None:
        """θ_i ← θ_i^start − w_ii Δ_i − Σ_j w_ij Δ_j; BatchNorm statistics ← Σ_j w_ij s_j."""
        state = self._state()
        moved = self.parameter_names if self.config.m_step == "updates" else frozenset()
        for name in moved:
            step = self.update[name] * float(weights[0])
            for weight, body in zip(weights[1:], models):
                step += float(weight) * torch.tensor(body.update[name], dtype=state[name].dtype)
            state[name].copy_(self.start[name] - step)
        average_states(
            {k: v for k, v in state.items() if k not in moved},
            float(weights[0]),
            [(float(w), body.tensors) for w, body in zip(weights[1:], models)],
        )

    def _mark_used(self, peers) -> None:
        """Each neighbour's model feeds one M-step at most."""
        for peer in peers:
            r, body, _ = self.models[peer]
            self.models[peer] = (r, body, True)

    def _uniform_row(self) -> dict[str, float]:
        uniform = 1.0 / (len(self.peers) + 1)
        return dict.fromkeys((self.node_id, *self.peers), uniform)

    def weights(self) -> dict[str, float]:
        return dict(self.row) if self.row else self._uniform_row()

    # --- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "row": dict(self.row),
            "audience": sorted(self.audience),
            "neighbours": None if self.neighbours is None else list(self.neighbours),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.row = {str(k): float(v) for k, v in state["row"].items()}
            self.audience = set(state["audience"])
            self.neighbours = None if state["neighbours"] is None else tuple(state["neighbours"])
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"the saved SCooL state does not fit: {exc}") from None


class ScoolDirac(_Scool):
    """D-PSGD: a fixed graph (every peer, uniform), local SGD, then θ_i ← Σ_j w_ij θ_j."""

    name = "scool-dirac"
    waits_for = frozenset({MessageType.MODEL})
    uses_updates = False

    def end_round(self, round: int) -> None:  # the graph is given: no E-step, never pruned
        fresh = self._fresh(round)
        self.missing.update({p: self.missing.get(p, 0) + 1 for p in self.peers if p not in fresh})
        weight = 1.0 / (len(fresh) + 1)
        average_states(self._state(), weight, [(weight, body.tensors) for body in fresh.values()])
        self._mark_used(fresh)

    def weights(self) -> dict[str, float]:
        return self._uniform_row()


class ScoolSbm(_Scool):
    """The stochastic-block-model prior: K blocks, memberships Ω, block matrix B."""

    name = "scool-sbm"

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup, config)
        config = self.config
        # A random start breaks the symmetry between blocks (uniform memberships never move).
        generator = np.random.default_rng(setup.seed)
        self.membership = generator.dirichlet(np.ones(config.blocks))
        self.blocks = block_matrix(config.blocks, config.block_within, config.block_between)
        self.proportions = np.full(config.blocks, 1.0 / config.blocks)

    def _extras(self) -> dict[str, np.ndarray]:
        return {MEMBERSHIP: self.membership.astype(np.float32)}

    def _check_model(self, body: Model) -> None:
        super()._check_model(body)
        membership = body.tensors[MEMBERSHIP]
        if (membership < 0).any() or not abs(float(membership.sum()) - 1.0) < 1e-3:
            raise PayloadRejected("bad_membership", f"block memberships {membership.tolist()} are not a distribution")

    def _e_step(self, round: int, peers: list[str], models: list[Model], scores: np.ndarray) -> np.ndarray:
        others = np.array([body.tensors[MEMBERSHIP] for body in models], dtype=np.float64).reshape(
            -1, self.config.blocks
        )
        edges, self.membership = sbm_e_step(
            scores,
            self.membership,
            others,
            self.blocks,
            self.proportions,
            self.config.temperature,
            self.config.e_sweeps,
            self.config.membership_damping,
        )
        if self.config.learn_blocks:
            self.blocks, self.proportions = sbm_blocks_m_step(
                edges, self.membership, others, self.blocks, self.config.block_strength
            )
        return row_normalise(edges)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "membership": torch.tensor(self.membership),
            "blocks": torch.tensor(self.blocks),
            "proportions": torch.tensor(self.proportions),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            membership, blocks = state["membership"].numpy(), state["blocks"].numpy()
            proportions = state["proportions"].numpy()
        except (KeyError, AttributeError) as exc:
            raise ValueError(f"the saved SBM state does not fit: {exc}") from None
        if membership.shape != self.membership.shape or blocks.shape != self.blocks.shape:
            raise ValueError(f"the saved SBM state has {membership.shape[0]} blocks, this node {self.config.blocks}")
        self.membership, self.blocks, self.proportions = membership, blocks, proportions


class ScoolAttention(_Scool):
    """The attention prior: an encoder of each model's update since θ_0, gossiped."""

    name = "scool-attention"

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup, config)
        config = self.config
        parameters = {
            f"{prefix}.{name}": p.shape
            for prefix, module in (("backbone", self.model.backbone), ("head", self.model.head))
            for name, p in module.named_parameters()
        }
        self.sketch = UpdateSketch(parameters, config.sketch_width, seed=setup.shared_seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(setup.shared_seed + 1)
            self.encoder = UpdateEncoder(self.sketch.size, config.encoder_hidden, config.encoder_dim)
        self.encoder_optimizer = torch.optim.Adam(self.encoder.parameters(), lr=config.encoder_learning_rate)

    def _extras(self) -> dict[str, np.ndarray]:
        return {ENCODER + name: to_numpy(p) for name, p in self.encoder.state_dict().items()}

    def _e_step(self, round: int, peers: list[str], models: list[Model], scores: np.ndarray) -> np.ndarray:
        own = self._state()
        signatures = torch.stack(
            [self.sketch(own, self.origin)]
            + [
                self.sketch({name: torch.tensor(body.tensors[name]) for name in self.sketch.names}, self.origin)
                for body in models
            ]
        )
        with torch.no_grad():
            prior = attention_prior(self.encoder(signatures), self.config.attention_temperature).double().numpy()
        weights = attention_weights(scores, prior, self.config.temperature)
        # The encoder learns to predict the likelihood's own verdict, softmax(y / T). Trained
        # towards w itself (which contains p), any p would be its own fixed point: no signal.
        target = torch.tensor(softmax(scores / self.config.temperature), dtype=torch.float32)
        for _ in range(self.config.encoder_steps):
            p = attention_prior(self.encoder(signatures), self.config.attention_temperature)
            loss = -(target * torch.log(p + 1e-12)).sum()
            self.encoder_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.encoder_optimizer.step()
        self._gossip_encoder(models)
        return weights

    @torch.no_grad()
    def _gossip_encoder(self, models: list[Model]) -> None:
        share = 1.0 / (len(models) + 1)
        theirs = [
            (share, {name[len(ENCODER) :]: t for name, t in body.tensors.items() if name.startswith(ENCODER)})
            for body in models
        ]
        average_states(self.encoder.state_dict(), share, theirs)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "encoder": self.encoder.state_dict(),
            "encoder_optimizer": self.encoder_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.encoder.load_state_dict(state["encoder"])
            self.encoder_optimizer.load_state_dict(state["encoder_optimizer"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ValueError(f"the saved attention encoder does not fit: {exc}") from None


class ScoolLocal(_Scool):
    """SCooL's model and optimiser with no communication at all: its Local baseline."""

    name = "scool-local"
    waits_for = frozenset()

    def publish(self, round: int) -> list[Outbound]:
        return []

    def expected(self, round: int) -> tuple[str, ...]:
        return ()

    def end_round(self, round: int) -> None:
        return None

    def weights(self) -> dict[str, float]:
        return {self.node_id: 1.0}
