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

Composed from parts: `ScoolNode` trains (SCooL-Local); `ModelGossip` adds the models to and
from peers (SCooL-Dirac mixes them); `ScoolEm` adds the score exchange (algorithms/graphs/scores.py)
and the EM over the graph with a prior (algorithms/graphs/priors.py: SBM or attention).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from protocol.messages import Body, MessageType, Model, Score

from ..graphs.cooperation import keep_top
from ..graphs.priors import AttentionPrior, SbmPrior
from ..graphs.scores import ScoreExchange
from ..interface import Algorithm, Frame, LocalReport, NodeSetup, Outbound, PayloadRejected, Staleness, uniform_row
from ..models.personal import make_model
from ..models.training import LocalTrainer, TrainedLocally, TrainingConfig, node_model, seeded_generator
from ..outliers import OutlierConfig, Scale, ScaleGuard, fold_into_self, state_scale
from ..payloads import SharedModules, average_states, check_model, shared_state, state_norm, to_numpy

__all__ = [
    "ScoolConfig",
    "ScoolNode",
    "ScoolLocal",
    "ModelGossip",
    "ScoolDirac",
    "ScoolEm",
    "ScoolSbm",
    "ScoolAttention",
]


# At pruning a stand-in (see ScoolEm._e_step) ranks at this share of its weight. On digits a
# cluster-mate's weight was within 1 % of a stand-in's, a stranger's at most 0.55 of it (SBM, the
# least contrasted prior): the mate keeps its place, the stranger does not take the stand-in's.
STAND_IN_RANK = 0.75


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
    # A neighbour's model is used only if it explains this node's data (scored here, per sample)
    # within this many nats of how well the neighbour says ours explains its data. Honest pairs
    # stay within a few nats either way (both models fit, or neither); a poisoned model does not.
    max_score_gap: float = 10.0
    # A neighbour's model (or update) far off the scale of ours and our neighbours' is refused
    # (`out_of_scale`, algorithms/outliers.py) before it is scored, weighed or applied.
    outliers: OutlierConfig = field(default_factory=OutlierConfig)
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
        if not self.max_score_gap > 0:
            raise ValueError(f"max_score_gap must be > 0 (inf: no check), got {self.max_score_gap}")
        if not 0 <= self.membership_damping < 1:
            raise ValueError(f"membership_damping must be in [0, 1), got {self.membership_damping}")
        if not 0 < self.keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {self.keep_fraction}")
        if not 0 < self.block_between < 1 or not 0 < self.block_within < 1:
            raise ValueError("block_within and block_between must be in (0, 1)")
        if not (self.block_strength > 0 and self.encoder_learning_rate > 0 and self.attention_temperature > 0):
            raise ValueError("block_strength, encoder_learning_rate and attention_temperature must be > 0")


class ScoolNode(TrainedLocally, Algorithm):
    """SCooL's model (θ_0, the same on every node) and its local SGD; it shares nothing."""

    homogeneous = True
    config_type = ScoolConfig

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup)
        self.config = config = config or ScoolConfig()
        self.data = setup.data
        self.spec, self.model = node_model(setup, setup.shared_seed, latent_dim=config.latent_dim)
        self.trainer = LocalTrainer.for_node(self.model, setup, config.training)
        self.shared = SharedModules({"backbone": self.model.backbone, "head": self.model.head})
        self.round = 0

    def local_step(self, round: int) -> LocalReport:
        self.round = round
        return self.trainer.run(self.cross_entropy)


class ScoolLocal(ScoolNode):
    """SCooL's model and optimiser with no communication at all: its Local baseline."""

    name = "scool-local"


class ModelGossip(ScoolNode):
    """Models to and from peers: the latest model of each, used by one M-step at most."""

    sends = frozenset({MessageType.MODEL})
    waits_for = frozenset({MessageType.MODEL})
    # A refused update (ScoolEm's models carry one) distrusts the peer for the model too.
    judged_parts: ClassVar[Mapping[MessageType, str]] = {MessageType.MODEL: "model"}

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup, config)
        self.neighbours: tuple[str, ...] | None = None  # None until pruned: everyone
        self.models: dict[str, tuple[int, Model, bool]] = {}  # peer → (round, model, used yet)
        self.guard = ScaleGuard(self.config.outliers, self.config.max_staleness)
        self.max_staleness = self.config.max_staleness  # the async schedule's bound replaces it

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.guard.set_peers(self.peers)

    def set_staleness(self, staleness: Staleness) -> None:
        """The async schedule's bound on a model's age replaces SCooL's own, so its E-step scores
        the same latest models the others mix; its M-step weighs them by its posterior, not by
        age (docs/learning.md, "Schedules")."""
        if staleness.max_staleness is not None:
            self.max_staleness = staleness.max_staleness

    def _model(self, round: int) -> Model:
        return self.shared.body()

    def _targets(self) -> tuple[str, ...]:
        return self.peers

    def publish(self, round: int) -> list[Outbound]:
        to = self._targets()
        return [Outbound(to=to, body=self._model(round))] if to else []

    def _check_fresh(self, peer: str, round: int, body: Body) -> None:
        if peer not in self.peers:
            raise PayloadRejected("not_a_peer", f"{peer} is not among this node's peers")
        if round < self.round - self.max_staleness:
            raise PayloadRejected("stale", f"{body.TYPE} for round {round}, this node is at {self.round}")

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        """A model of our form; the parts whose scale is checked: (theirs, ours) of each."""
        assert isinstance(body, Model)
        self.shared.check(body)
        return {"model": Scale(self.shared.scale_of(body.tensors), self.shared.scale())}

    def _distrusted(self) -> frozenset[str]:
        """Peers listened to whose models were refused for their form or scale (outliers.py):
        absent, and their weight is the node's own."""
        allowed = set(self.peers) if self.neighbours is None else set(self.neighbours)
        return self.guard.distrusted() & allowed

    def screen(self, peer: str, round: int, body: Body) -> None:
        """A peer's model for a round not too old, and not one held already: before its content
        is judged, and no cause to distrust the peer."""
        self._check_fresh(peer, round, body)
        held = self.models.get(peer)
        if held is not None and held[0] >= round:
            raise PayloadRejected("duplicate_model", f"a model for round {round} from {peer} is already held")

    def keep(self, peer: str, round: int, body: Body, frame: Frame | None) -> None:
        assert isinstance(body, Model)
        self.models[peer] = (round, body, False)

    def latest_rounds(self) -> dict[str, int]:
        return {peer: round for peer, (round, _, _) in self.models.items()}

    def expected(self, round: int) -> tuple[str, ...]:
        if round == 0:
            return self.peers
        recent = {peer for peer, (r, _, _) in self.models.items() if r >= round - 1}
        if self.neighbours is not None:
            recent &= set(self.neighbours)
        return tuple(sorted(recent & set(self.peers)))

    def _fresh(self, round: int) -> dict[str, Model]:
        """Neighbours' models of this round (or a little older; async, or ahead) not yet used by an
        M-step."""
        allowed = set(self.peers) if self.neighbours is None else set(self.neighbours)
        return {
            peer: body
            for peer, (r, body, used) in sorted(self.models.items())
            if peer in allowed and not used and round - r <= self.max_staleness
        }

    def _mark_used(self, peers) -> None:
        """Each neighbour's model feeds one M-step at most."""
        for peer in peers:
            r, body, _ = self.models[peer]
            self.models[peer] = (r, body, True)


class ScoolDirac(ModelGossip):
    """D-PSGD: a fixed graph (every peer, uniform), local SGD, then θ_i ← Σ_j w_ij θ_j."""

    name = "scool-dirac"

    def end_round(self, round: int) -> None:  # the graph is given: no E-step, never pruned
        distrusted = self._distrusted()
        fresh = {peer: body for peer, body in self._fresh(round).items() if peer not in distrusted}
        weight = 1.0 / (len(fresh) + len(distrusted) + 1)
        self.shared.mix(1.0 - weight * len(fresh), [(weight, body) for body in fresh.values()])
        self._mark_used(fresh)

    def weights(self) -> dict[str, float]:
        return fold_into_self(uniform_row(self.node_id, self.peers), self.node_id, self._distrusted())


class ScoolEm(ModelGossip):
    """SCooL's EM: models travel with their update, every receiver answers with a score, and
    each node's row of W comes from the scores under a prior (`_prior`, chosen by subclasses)."""

    sends = frozenset({MessageType.MODEL, MessageType.SCORE})
    waits_for = frozenset({MessageType.MODEL, MessageType.SCORE})

    def __init__(self, setup: NodeSetup, config: ScoolConfig | None = None) -> None:
        super().__init__(setup, config)
        self.scratch = make_model(self.spec).to(setup.device)  # where a peer's parameters are loaded to be scored
        # Parameters move by the neighbours' updates; BatchNorm statistics are mixed instead
        # (start − Σ w Δ of a running variance can go negative; a convex mix cannot).
        self.parameter_names = frozenset(
            f"{prefix}.{name}"
            for prefix, module in self.shared.modules.items()
            for name, _ in module.named_parameters()
        )
        self.prior = self._prior()
        self.exchange = ScoreExchange(self.node_id)
        self.start: dict[str, torch.Tensor] = {}  # θ_i^start of the round in progress
        self.update: dict[str, torch.Tensor] = {}  # Δ_i of the round in progress
        self.own_score = 0.0  # log P(D_i | θ_i) per sample, this round
        self.audience: set[str] = set()  # peers that kept this node after pruning: they get its model
        self.row: dict[str, float] = {}
        self._batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _prior(self) -> SbmPrior | AttentionPrior:
        raise NotImplementedError

    # --- the local step and what is published ------------------------------------------

    def local_step(self, round: int) -> LocalReport:
        self.start = {name: tensor.clone() for name, tensor in self.shared.state().items()}
        report = super().local_step(round)
        self.update = {
            name: self.start[name] - tensor
            for name, tensor in self.shared.state().items()
            if name in self.parameter_names
        }
        self.own_score = self._log_likelihood(self.model, round) / self._score_batch(round)[1].numel()
        return report

    def _targets(self) -> tuple[str, ...]:
        if self.neighbours is None:
            return self.peers
        return tuple(sorted((set(self.neighbours) | self.audience) & set(self.peers)))

    def _model(self, round: int) -> Model:
        body = self._own_body()
        self.exchange.remember_own(round, body)
        return body

    def _own_body(self) -> Model:
        tensors = {name: to_numpy(t) for name, t in self.shared.state().items()} | self.prior.extras()
        return Model(kind="params", tensors=tensors, update={name: to_numpy(t) for name, t in self.update.items()})

    def published(self, round: int, out: Outbound, seq: int) -> None:
        if isinstance(out.body, Model):
            self.exchange.sent_model(round, seq, out.to)

    # --- what arrives ----------------------------------------------------------------------

    def screen(self, peer: str, round: int, body: Body) -> None:
        if isinstance(body, Model) and self._kept_by(peer, round):
            self.audience.add(peer)  # answered with our model from now on, even if this one is late
        if isinstance(body, Score):
            self._check_fresh(peer, round, body)
        else:
            super().screen(peer, round, body)

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        """A model with its update and the prior's extras, of our form; the scale of both."""
        assert isinstance(body, Model)
        check_model(body, {**self.shared.state(), **self.prior.extras()})
        if body.update is None or body.update.keys() != self.parameter_names:
            raise PayloadRejected("bad_shape", "the model's update must cover every parameter, and only those")
        self.prior.check(body)
        own = math.hypot(self.shared.scale(), state_scale(self.prior.extras()))
        return {
            "model": Scale(self.shared.scale_of(body.tensors), own),
            "update": Scale(state_scale(body.update), state_norm(self.update), step=True),
        }

    def keep(self, peer: str, round: int, body: Body, frame: Frame | None) -> None:
        if isinstance(body, Score):
            self.exchange.take_score(peer, round, body)
            return
        super().keep(peer, round, body, frame)
        if frame is not None:
            self.exchange.owe(peer, round, frame, body)

    def _kept_by(self, peer: str, round: int) -> bool:
        """A peer this node did not keep at pruning sends it a model after pruning: it kept us."""
        pruned = self.neighbours is not None and round >= self.config.prune_round
        return pruned and peer in self.peers and peer not in self.neighbours

    def respond(self) -> list[Outbound]:
        """Score each model received since the last call on this node's own data; a peer that
        sent its model without getting ours (it kept this node at pruning, we did not keep it)
        gets ours too, so that its round completes without waiting for its deadline."""
        answers = []
        for peer, round, frame, body in self.exchange.take_owed():
            own = self.exchange.own_model(round)
            if own is not None and peer not in self.exchange.sent_to(round):
                answers.append(Outbound(to=(peer,), body=own, round=round))
            for name, tensor in shared_state({"backbone": self.scratch.backbone, "head": self.scratch.head}).items():
                # A copy (wire arrays are read-only), made where the scratch model is.
                tensor.copy_(torch.tensor(body.tensors[name], dtype=tensor.dtype, device=tensor.device))
            value = self._log_likelihood(self.scratch, round)
            samples = int(self._score_batch(round)[1].numel())
            self.exchange.checked(peer, round, value / samples)
            score = Score(
                kind="log_likelihood", subject=frame.sender_key, subject_seq=frame.seq, value=value, samples=samples
            )
            answers.append(Outbound(to=(peer,), body=score, round=round))
        return answers

    def _score_batch(self, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's scoring batch of this node's training data: the same for every model scored
        this round, so the scores compare."""
        if round not in self._batches:
            count = min(self.config.score_samples, len(self.data.train_labels))
            generator = seeded_generator(self.setup.seed, 2, round)  # on the CPU: the same batch on any device
            chosen = torch.randperm(len(self.data.train_labels), generator=generator).to(self.setup.device)
            self._batches = {r: b for r, b in self._batches.items() if r > round - self.exchange.history}
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

    # --- E-step, M-step, pruning -----------------------------------------------------------

    def end_round(self, round: int) -> None:
        cooperating, stand_ins, weights = self._e_step(round)
        count = len(cooperating) + 1
        kept = weights[:count].copy()
        kept[0] += weights[count:].sum()  # the stand-ins' weight is the node's own
        self.row = {self.node_id: float(kept[0])}
        self.row.update({p: float(w) for p, w in zip(cooperating, kept[1:], strict=True)})
        self._m_step(kept, [self.models[p][1] for p in cooperating])
        self._mark_used(cooperating)
        if self.neighbours is None and self.config.prune_round and round + 1 >= self.config.prune_round:
            # A stand-in competes for a place as the peer it stands for: kept, the node goes on
            # keeping that weight while it distrusts the peer, rather than give it to a stranger ...
            others = {p: w for p, w in self.row.items() if p != self.node_id}
            # ... ranked a little below its weight: it is the node's own model a second time, and
            # a real peer about as good (a cluster-mate) brings its data.
            others.update(zip(stand_ins, (weights[count:] * STAND_IN_RANK).tolist(), strict=True))
            self.neighbours = keep_top(others, len(self.peers), self.config.keep_fraction)
        self.exchange.forget_before(round)

    def _e_step(self, round: int) -> tuple[list[str], list[str], np.ndarray]:
        """The prior's weights over the node, then the cooperating neighbours, then stand-ins.

        A stand-in is a neighbour whose models were refused for their form or scale, or whose
        model failed the check of `_consistent`: the prior weighs it as the node itself (the node's
        score and model), and the node keeps that weight. Left out, its weight would go to the
        others, strangers included, when it was the node's only cluster-mate."""
        fresh = self._fresh(round)
        scores = self.exchange.scores_of(round)
        distrusted = self._distrusted()
        verdicts = {p: self._consistent(p, scores[p]) for p in fresh if p in scores and p not in distrusted}
        cooperating = [p for p, consistent in verdicts.items() if consistent]
        stand_ins = sorted(distrusted | {p for p, consistent in verdicts.items() if consistent is False})
        own = [self._own_body()] * len(stand_ins) if stand_ins else []
        y = np.array([self.own_score] + [scores[p] for p in cooperating] + [self.own_score] * len(stand_ins))
        return cooperating, stand_ins, self.prior.weights(y, [fresh[p] for p in cooperating] + own, self.shared.state())

    def _consistent(self, peer: str, claimed: float) -> bool | None:
        """Whether `peer`'s model explains this node's data within `max_score_gap` nats per sample
        of what `peer` claims ours does on its data (`claimed`); None until this node has scored
        it. The E-step trusts the peer's word about its data, and the M-step applies its update:
        a model that fails here is poisoned, and neither its update nor its statistics nor its
        encoder is taken."""
        mine = self.exchange.check_of(peer, self.models[peer][0])
        return None if mine is None else mine >= claimed - self.config.max_score_gap

    @torch.no_grad()
    def _m_step(self, weights: np.ndarray, models: list[Model]) -> None:
        """θ_i ← θ_i^start − w_ii Δ_i − Σ_j w_ij Δ_j; BatchNorm statistics ← Σ_j w_ij s_j."""
        state = self.shared.state()
        moved = self.parameter_names if self.config.m_step == "updates" else frozenset()
        for name in moved:
            step = self.update[name] * float(weights[0])
            for weight, body in zip(weights[1:], models, strict=True):
                step += float(weight) * torch.tensor(body.update[name], dtype=state[name].dtype, device=step.device)
            state[name].copy_(self.start[name] - step)
        average_states(
            {k: v for k, v in state.items() if k not in moved},
            float(weights[0]),
            [(float(w), body.tensors) for w, body in zip(weights[1:], models, strict=True)],
        )

    def weights(self) -> dict[str, float]:
        return dict(self.row) if self.row else uniform_row(self.node_id, self.peers)

    # --- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            **self.prior.state_dict(),
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
        self.prior.load_state_dict(state)


class ScoolSbm(ScoolEm):
    """The stochastic-block-model prior: K blocks, memberships Ω, block matrix B."""

    name = "scool-sbm"

    def _prior(self) -> SbmPrior:
        return SbmPrior(self.config, self.setup.seed)


class ScoolAttention(ScoolEm):
    """The attention prior: an encoder of each model's update since θ_0, gossiped."""

    name = "scool-attention"

    def _prior(self) -> AttentionPrior:
        return AttentionPrior(self.config, self.shared.state(), self.parameter_names, self.setup.shared_seed)
