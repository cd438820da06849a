"""MAPL-Auto: MAPL-Dual everywhere, and MAPL+ between neighbours that run the same model.

MAPL-Dual's small shared model lets nodes with different backbones gain from each other; where
a node's neighbours run its own backbone, averaging that backbone (MAPL+) gains more (issue #44:
on 2-5 devices with one model everywhere MAPL-Dual lost to Local where MAPL+ gained +5). A user
should not have to know which fits the fleet, so the node finds out from what its peers announce:

- Each MODEL it sends carries, beside the small model, its own model's architecture (`ARCH_KEY`:
  a 16-byte digest of the names and shapes of its backbone and projector).
- To every peer whose latest MODEL announced the same architecture, neighbour or not, the MODEL
  also carries its own backbone and projector (under `OWN_PREFIX`). The first round, knowing
  nobody yet, it sends every peer the small model alone.
- End of round: the small model is mixed as in MAPL-Dual; the own backbone and projector over
  the node and the peers that sent theirs, in equal shares, over the learned row, or a blend
  (`own_uniform_share`); what is personal, the head and prototypes, follows the learned graph.
  A node alone with its architecture is MAPL-Dual.
- Every node starts its own model from the network's shared seed, so same-model nodes start
  alike and their average is a model from the first round (with separate starts, the average
  of the first rounds mixed unrelated features: digits, 8 rounds, the convnet nodes ended at
  53 and 77 % against Local's 79 and 88).
- It trains a local-only model beside them, as `local` trains (`keep_local`), and serves its own
  model and the local-only one where every peer runs its model (one model everywhere), MAPL-Dual's
  ensemble of the own and the small model with the local-only one where the fleet mixes models
  (its own model mixed with its same-model peers' inside, where it has some): a node the others
  cannot help, or whose own model they led astray, ends near its Local, not under it. Each
  model's vote in a mix weighs the nodes whose images trained it (`member_weights`).
  And none of these where another is clearly better (`predict = "auto"`, selection.py). By
  default nothing is held out: after each round it checks its predictors on its own training
  images and serves another only
  where it fits 20 points more of them, sign-tested (`fit_margin`, `switch_p`): a model that
  learns too slowly. With `validation_fraction` > 0 it holds out that share of its training
  images, trains a local-only model beside the others on the rest, and serves whichever
  predictor gets 10 points more of the held-out images right (`switch_margin`, over
  `choice_window` rounds, and significantly; training alone first on a tie); from `refit_round`
  the held-out images train every model and the choice stays.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from protocol.messages import Body, MessageType, Model

from ..interface import Evaluation, Frame, LocalReport, NodeSetup, Outbound, PayloadRejected
from ..models.losses import ensemble_logits
from ..models.selection import Choice, Chooser, held_out_right, hold_out, training_sample
from ..models.statistics import refresh_statistics
from ..models.training import evaluate_predictors
from ..outliers import Scale
from ..payloads import SharedModules
from .dual import DISTILL_WHERE, DualConfig, DualPredictors, MaplDual
from .mapl import Local

__all__ = ["ARCH_KEY", "AutoConfig", "MaplAuto", "OWN_PREFIX"]

ARCH_KEY = "arch"
OWN_PREFIX = "own."
ARCH_BYTES = 16
# The share of the others in a learned row, or of same-model peers in a round's mix of the own
# model, from which the node counts as collaborating (`alone`) or mixing its own model
# (`mixes_own`: the small model then teaches only where it is better): a node alone in its
# cluster keeps 1 % on the others in its learned row (mnist5k, 3 nodes).
SHARED_MIN = 0.05
# Its predictors, in the order a tie on the held-out images goes: the collaborative ones first.
AUTO_PREDICTORS = ("personal", "ensemble", "ensemble_local", "personal_local", "shared", "local")
# The predictors that need the local-only model.
WITH_LOCAL = ("local", "personal_local", "ensemble_local")
# The models a mix can hold, in the order of their votes (`MaplAuto.votes`), and what each mix
# holds of them: one table for what AutoPredictors computes and what `_why` says.
MEMBERS = ("own", "small", "local-only")
MIXES = {"ensemble": (0, 1), "personal_local": (0, 2), "ensemble_local": (0, 1, 2)}
# What may replace the collaborative predictor where it is clearly worse, ties to the first:
# training alone, then the small shared model, then mixes.
ALTERNATIVES = ("local", "shared", "ensemble", "personal", "personal_local")


@dataclass(frozen=True)
class AutoConfig(DualConfig):
    # The own backbone and projector go to same-model peers every round (MAPL+ sends them to all)
    # or, with false, only once warm-up ends and then to the learned neighbours and explored peers.
    own_during_warmup: bool = True
    # How the own backbone is mixed: own_uniform_share β of equal weights over the node and every
    # same-model peer that sent its own (the backbone shared by all who can share it, as FedRep
    # shares a representation, sent to each every round), 1 − β of the learned row renormalised
    # over the node and those peers (only the cluster's). The head, prototypes and small model
    # follow the learned graph whatever β. On 3 and 4 nodes β made no difference beyond the
    # seeds' spread; on 10 nodes equal shares mix clusters (seeds 0-2, 40 rounds, gain over Local
    # and the worst node: digits, one backbone, β = 1 +0.6 / -3.8, β = 0 +1.9 / -2.3; mnist5k,
    # four backbones, -2.2 / -19.2 and +2.4 / -9.0, with SHARED_MIN; docs/learning.md).
    own_uniform_share: float = 0.0
    # "auto": the own model (`personal`) where every peer runs it, the ensemble of the own and the
    # small model where the fleet mixes models, each with the local-only model where it is kept
    # (`keep_local`), unless another is clearly better (below). On one
    # backbone everywhere the ensemble was 1.4-2.0 points below the own model (mnist5k, 4 nodes,
    # 40 rounds, seeds 0-2): the small model, 5-7 points weaker, pulls it down; on resnet and
    # mobilenet nodes, mixed with a same-model peer or not, the ensemble was the higher
    # (docs/learning.md).
    predict: str = "auto"
    # The share of each class's training images held out to choose the predictor on; the node
    # also trains a local-only model on the rest, so it can serve that where its neighbours do
    # not help. 0: nothing held out: the node checks its predictors on its training images
    # instead (`fit_margin`). A fifth held out cost 1.5 and 2.1 points on four
    # backbones and never switched (mnist5k, 3 and 4 nodes, seeds 3-9; docs/learning.md).
    validation_fraction: float = 0.0
    # With nothing held out: train a local-only model beside the others all run (as the `local`
    # baseline trains, on every training image) and serve it in the mix: with the own model in a
    # one-model fleet (`personal_local`), with the own and small models in a mixed one
    # (`ensemble_local`). Against the two-model predictors, gain over Local and the worst node
    # (40 rounds, tuning seeds: mnist5k 3-9, 57, 58; folder 3-6; docs/learning.md): mnist5k 3 nodes
    # four backbones +4.6 / -5.2 → +5.5 / +0.0, 4 nodes +5.7 / -4.2 → +5.7 / +0.0, one backbone
    # +0.9 / -4.2 → +1.5 / -0.7 and +2.1 / -2.2 → +2.1 / -0.5; folder 10 nodes four backbones
    # +6.5 / +0.0 → +5.8 / +0.7; heterogeneous benchmark 95.07 → 94.89 %. A third model's training
    # (20-40 % longer rounds); nothing on the wire.
    keep_local: bool = True
    # How much each model's vote counts in the node's mixes (`ensemble`, `personal_local`,
    # `ensemble_local`). "evidence": the number of nodes whose images trained it, counted over
    # the weights it is mixed with (`MaplAuto.votes`): the small model is the mix of the node's
    # cluster, the own model of its same-model peers there, the local-only model of the node
    # alone. "equal": the plain mean. Gain over Local and the worst node (40 rounds, tuning seeds
    # 3-6; docs/learning.md, "Votes by evidence"): mnist5k 10 nodes four backbones +5.2 / -0.2 →
    # +6.3 / -0.5, one backbone +2.8 / +0.0 → +3.6 / -0.5, folder 10 nodes four +5.8 / +0.7 → +7.2
    # / +0.0, mnist5k 4 nodes four +5.8 / +0.2 → +7.0 / -0.5; heterogeneous benchmark (seeds 0-2)
    # 94.9 → 95.6 %.
    member_weights: str = "evidence"
    # From this round on the held-out images train every model too and the choice made by then
    # stays (holding out a fifth of ten images a class for the whole run cost the own model 1.2
    # points, mnist5k, 4 nodes, seeds 0-2). None: they are never trained on; a run's
    # configuration (registry.run_config) sets two thirds of its rounds.
    refit_round: int | None = None
    # The local-only model is served only where it beats the collaborative predictor on the
    # held-out images by this much (accuracy, mean over the last `choice_window` rounds:
    # selection.Chooser says why).
    switch_margin: float = 0.1
    choice_window: int = 5
    # ... and significantly so: a one-sided sign test over the held-out images where the two
    # disagree must give at most this (selection.Chooser says why).
    switch_p: float = 0.05
    # With nothing held out: another predictor replaces the collaborative one only where it gets
    # at least this many more of the node's training images right (and significantly, `switch_p`),
    # checked on up to `fit_images` of them: a model that cannot fit the node's own data, as a
    # ShuffleNet from scratch that learns too slowly (selection.training_sample).
    fit_margin: float = 0.2
    fit_images: int = 200
    # "auto": where the own model is mixed with same-model peers (MAPL+'s regime) the small model
    # teaches it only on the samples where it is better on the label, elsewhere on every sample
    # (MAPL-Dual's). On one backbone everywhere the own model is the stronger: distilling the
    # small one into it on every sample cost 0.6 points (mnist5k, 3 and 4 nodes, 40 rounds, seeds
    # 0-2: 93.6 and 94.4 %; gated 94.4 and 95.2, "auto" 93.9 and 95.2, MAPL+ 94.5 and 95.4); on four
    # backbones (no same-model peer) gating cost the ensemble 0.6 and 0.7 (docs/learning.md).
    # Gating also where the own model fits the node's training images at least as well as the
    # small model helped on tuning seeds and cost a ResNet 7 points on seed 64: not adopted
    # (docs/learning.md, "The nodes under their Local").
    distill_where: str = "auto"
    # The small model and the own modules travel as float16: half the bytes, at no cost measured
    # (mnist5k, 10 nodes, four backbones, 80 rounds, seeds 0-2: 1,080 KiB a node and round and
    # 95.2 % served as float32, 557 KiB and 95.1 % as float16; docs/learning.md).
    encoding: str = "float16"
    predict_choices: ClassVar[tuple[str, ...]] = (*AUTO_PREDICTORS, "auto")
    distill_where_choices: ClassVar[tuple[str, ...]] = (*DISTILL_WHERE, "auto")
    member_weights_choices: ClassVar[tuple[str, ...]] = ("evidence", "equal")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.own_uniform_share <= 1:
            raise ValueError(f"own_uniform_share must be in [0, 1], got {self.own_uniform_share}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.predict in WITH_LOCAL and self.validation_fraction == 0 and not self.keep_local:
            raise ValueError(f"predict = {self.predict!r} needs the local model: keep_local or validation_fraction > 0")
        if self.refit_round is not None and self.refit_round < 0:
            raise ValueError(f"refit_round must be ≥ 0, got {self.refit_round}")
        if self.choice_window < 1 or not 0 <= self.switch_margin <= 1 or not 0 < self.switch_p <= 1:
            raise ValueError("choice_window must be ≥ 1, switch_margin in [0, 1] and switch_p in (0, 1]")
        if not 0 <= self.fit_margin <= 1 or self.fit_images < 1:
            raise ValueError("fit_margin must be in [0, 1] and fit_images ≥ 1")
        if self.member_weights not in self.member_weights_choices:
            choices = ", ".join(self.member_weights_choices)
            raise ValueError(f"member_weights must be one of {choices}, got {self.member_weights!r}")


def architecture(modules: SharedModules) -> np.ndarray:
    """A digest of the names and shapes of `modules`' state: equal where the models mix."""
    shapes = sorted((name, tuple(tensor.shape)) for name, tensor in modules.state().items())
    return np.frombuffer(hashlib.blake2b(repr(shapes).encode(), digest_size=ARCH_BYTES).digest(), dtype=np.uint8)


def split_model(body: Model) -> tuple[dict[str, np.ndarray], np.ndarray | None, dict[str, np.ndarray]]:
    """A MAPL-Auto MODEL's small model, announced architecture and own modules."""
    small, own = {}, {}
    for name, tensor in body.tensors.items():
        if name.startswith(OWN_PREFIX):
            own[name[len(OWN_PREFIX) :]] = tensor
        elif name != ARCH_KEY:
            small[name] = tensor
    return small, body.tensors.get(ARCH_KEY), own


class AutoPredictors(DualPredictors):
    """The own and the small model, the local-only model, and their mixes: `ensemble` (own and
    small), `personal_local` (own and local-only), `ensemble_local` (all three), each member's
    probabilities weighed by its vote (own, small, local-only: `MaplAuto.votes`)."""

    def __init__(
        self,
        personal: nn.Module,
        shared: nn.Module,
        local: nn.Module | None,
        chosen: str,
        votes: tuple[float, float, float] = (1.0, 1.0, 1.0),
    ) -> None:
        super().__init__(personal, shared, chosen)
        self.local = local
        # A buffer: a copy of the predictors' state (inference.EvaluatedModel) and an export
        # carry the votes of the round they were evaluated in.
        device = next(personal.parameters()).device
        self.register_buffer("votes", torch.tensor(votes, dtype=torch.float32, device=device))

    def all(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        models = {"personal": self.head(self.backbone(images)), "shared": self.shared(images)}
        if self.local is not None:
            models["local"] = self.local.head(self.local.backbone(images))
        held = list(models.values())  # in MEMBERS' order
        mixes = {
            name: ensemble_logits(*(held[member] for member in members), weights=self.votes[list(members)])
            for name, members in MIXES.items()
            if max(members) < len(held)
        }
        return {**models, **mixes}


class MaplAuto(MaplDual):
    """MAPL-Dual, plus MAPL+'s backbone averaging with the peers whose own model is the same."""

    name = "mapl-auto"
    config_type = AutoConfig
    shared_start = True  # same-model nodes average their backbones from the first round

    def __init__(self, setup: NodeSetup, config: AutoConfig | None = None) -> None:
        config = config or AutoConfig()
        # Every model trains on the shard less the held-out images; the node's setup stays whole
        # (its preprocessing, and `[algorithm].local_baseline`'s model, which trains on all of it).
        self.held_out = hold_out(setup.data, config.validation_fraction, setup.seed)
        fit = setup if self.held_out is None else dataclasses.replace(setup, data=self.held_out.fit)
        super().__init__(fit, config)
        self.setup = setup
        self.own = SharedModules({"backbone": self.model.backbone, "projector": self.model.projector})
        self.arch = architecture(self.own)
        # peer → (the round of the MODEL that first gave the verdict its latest MODELs give, whether
        # they announce our architecture)
        self.same_model: dict[str, tuple[int, bool]] = {}
        self.mixes_own = False  # whether same-model peers hold SHARED_MIN of this round's own mix
        self.own_mixed_with = 0  # how many same-model peers had a share of it
        keep = self.held_out is not None or config.keep_local
        self.local = Local(fit, config) if keep else None  # what training alone gives
        # Whether the learned row gives nobody else SHARED_MIN (what `status` says of it): None
        # until the graph is learned.
        self.alone: bool | None = None
        # What the choice is made on: the held-out images, or (nothing held out) training images.
        held = self.held_out is not None
        self.checked = self.held_out if held else training_sample(setup.data, config.fit_images, setup.seed)
        margin = config.switch_margin if held else config.fit_margin
        self.chooser = Chooser(config.choice_window, margin, config.switch_p)
        self.choice: Choice | None = None  # the latest choice on `checked`
        self.refitted = False  # whether the held-out images train the models now

    # -- local step, choice and prediction --------------------------------------------------

    def local_step(self, round: int) -> LocalReport:
        refit = self.config.refit_round
        if self.held_out is not None and refit is not None and round >= refit and not self.refitted:
            self._refit()
        report = super().local_step(round)
        if self.local is None:
            return report
        trained_alone = self.local.local_step(round)
        parts = {**report.parts, "local_loss": trained_alone.loss}
        return dataclasses.replace(report, parts=parts, steps=report.steps + trained_alone.steps)

    def _refit(self) -> None:
        """The choice is made: the held-out images train every model from now on (a resumed
        node gets here again in its first round, so it trains on what it trained on before)."""
        full = self.setup.data
        for trainer in (self.trainer, self.local.trainer):
            trainer.images, trainer.labels = full.train_images, full.train_labels
        self.refitted = True

    def distill_where(self) -> str:
        if self.config.distill_where != "auto":
            return self.config.distill_where
        return "teacher_better" if self.mixes_own else "all"

    def one_model_fleet(self) -> bool:
        """Whether every peer heard from announced our model (one backbone everywhere, what `init`
        writes): there the own model is the strongest predictor the node holds, mixed or not."""
        return bool(self.same_model) and all(same for _, same in self.same_model.values())

    def _collaborative(self) -> str:
        """The predictor the network's models give: the own model where every peer runs it,
        MAPL-Dual's ensemble of the own and the small model where the fleet mixes models, even
        where the node mixes its own model with same-model peers: there the own model of a ResNet
        pair ended 15 points under Local where the ensemble was 9 under, and served its nodes 2.7
        points over Local on the mean where the ensemble served 4.2 (convnet pairs: 1.3 and 1.1;
        four backbones, tuning seeds 7-9, 11, 12, 16-18, 20, 26-28; docs/learning.md). With the
        local-only model kept (`keep_local`, nothing held out), that model joins either mix: a
        node whose neighbours cannot help it, or whose own model the small one or the shared
        start led astray, then ends near its Local, not under it (docs/learning.md, "Every node
        keeps its local-only model")."""
        with_local = self.local is not None and self.held_out is None
        if self.one_model_fleet():
            return "personal_local" if with_local else "personal"
        return "ensemble_local" if with_local else "ensemble"

    def _why(self) -> str:
        """Why `_collaborative` gives what it gives, for `status` and the report."""
        why, served = self._peers_why(), self._collaborative()
        if served in WITH_LOCAL:
            why = f"{why}; with its local-only model"
        if self.config.member_weights == "equal" or served not in MIXES:
            return why
        votes = self.votes()
        return f"{why}; votes " + ", ".join(f"{MEMBERS[member]} {votes[member]:.1f}" for member in MIXES[served])

    def votes(self) -> tuple[float, float, float]:
        """How much the own, the small and the local-only model's votes count in the node's mixes:
        with `member_weights = "evidence"` the number of nodes whose images trained each, counted
        over the weights it is mixed with (1 / Σ w²: two equal shares make 2, a row that keeps
        99 % on the node 1.0): the small model's over the learned row, the own model's over its
        share of that row among the same-model peers (1 where it mixes with none), the local-only
        model's 1."""
        if self.config.member_weights == "equal":
            return (1.0, 1.0, 1.0)
        row = self.graph.weights()
        same = (peer for peer, (_, is_same) in self.same_model.items() if is_same)
        return (_effective(self._own_weights((self.node_id, *same), row)), _effective(row), 1.0)

    def _peers_why(self) -> str:
        """What the node's peers give it."""
        if self.alone:
            own = self.graph.weights().get(self.node_id, 1.0)
            return f"collaborates with nobody: its learned row keeps {own * 100:.0f} % on itself"
        mixed = f"mixed with {self.own_mixed_with} same-model peer{'' if self.own_mixed_with == 1 else 's'}"
        if self.one_model_fleet():
            return mixed if self.mixes_own else "every peer runs its model, none shares it this round"
        if self.mixes_own:
            return f"{mixed}, with the small model: the fleet mixes models"
        if any(same for _, same in self.same_model.values()):
            return "no same-model peer shares its model this round"
        return "no peer runs its model" if self.same_model else "no peer heard from yet"

    def predictors(self) -> AutoPredictors:
        """What the node may serve: MAPL-Dual's three, and the local-only model and its mixes
        where the node keeps one."""
        chosen = self.config.predict
        if chosen == "auto":
            chosen = self._collaborative() if self.choice is None else self.choice.chosen
        local = None if self.local is None else self.local.model
        if local is None and chosen in WITH_LOCAL:  # chosen before a resume without it
            chosen = self._collaborative()
        return AutoPredictors(self.model, self.small, local, chosen, self.votes())

    def evaluate(self) -> Evaluation:
        evaluation = evaluate_predictors(self.predictors(), self._models(), self.data)
        chose_by_peers = self.config.predict == "auto" and evaluation.predictor == self._collaborative()
        why = self._why() if chose_by_peers else self._unfit_why(evaluation.predictor)
        if self.choice is None or self.held_out is None:  # training images are no held-out score
            return dataclasses.replace(evaluation, why=why)
        return dataclasses.replace(
            evaluation, validation=self.choice.accuracy, validation_total=self.choice.images, why=why
        )

    def _models(self) -> nn.ModuleList:
        """The models the predictors run on, for evaluation mode: the own and the local-only one."""
        return nn.ModuleList([self.trainer.model, *([] if self.local is None else [self.local.model])])

    def _unfit_why(self, served: str) -> str:
        """Where nothing is held out and the check on the training images chose `served`."""
        if self.held_out is not None or self.choice is None or self.config.predict != "auto":
            return ""
        accuracy, collaborative = self.choice.accuracy, self._collaborative()
        return (
            f"fits {accuracy[served] * 100:.0f} % of {self.choice.images} training images, "
            f"{collaborative} {accuracy[collaborative] * 100:.0f} %"
        )

    def _choose(self) -> None:
        """After the round's aggregation, until the refit: the predictor the node serves."""
        if self.refitted:
            return
        predictors = self.predictors()
        refresh_statistics(predictors.all, self._models(), self.data.train_images)  # as evaluation will
        right = held_out_right(predictors, self._models(), self.checked)
        self.choice = self.chooser.update(right, self._collaborative(), ALTERNATIVES)

    # -- publish and receive ----------------------------------------------------------------

    def publish(self, round: int) -> list[Outbound]:
        out = super().publish(round)  # prototypes and the small model, to the same peers
        if not out:
            return out
        small = out.pop()
        recipients = small.to
        if self.config.own_uniform_share > 0:  # every same-model peer, neighbour or not
            same = tuple(sorted(peer for peer in self.peers if self._same_before(peer, round)))
            recipients = tuple(sorted({*recipients, *same}))
        elif self.graph.learning(round) or self.config.own_during_warmup:
            same = tuple(peer for peer in recipients if self._same_before(peer, round))
        else:
            same = ()
        tensors = {**small.body.tensors, ARCH_KEY: self.arch}
        own_state = self.own.body(self.config.encoding).tensors
        own = {f"{OWN_PREFIX}{name}": array for name, array in own_state.items()}
        others = tuple(peer for peer in recipients if peer not in same)
        bodies = ((same, {**tensors, **own}), (others, tensors))
        return [*out, *(Outbound(to=to, body=Model(kind="params", tensors=t)) for to, t in bodies if to)]

    def inspect(self, peer: str, round: int, body: Body) -> dict[str, Scale]:
        if not isinstance(body, Model):
            return super().inspect(peer, round, body)
        small, arch, own = split_model(body)
        if arch is not None and (arch.dtype != np.uint8 or arch.shape != (ARCH_BYTES,)):
            raise PayloadRejected("bad_shape", f"{ARCH_KEY} is {arch.dtype} {arch.shape}, expected {ARCH_BYTES} bytes")
        scales = super().inspect(peer, round, Model(kind=body.kind, tensors=small))
        if own:
            if arch is None or not np.array_equal(arch, self.arch):
                raise PayloadRejected("bad_shape", "own modules sent under another architecture than ours")
            self.own.check(Model(kind=body.kind, tensors=own))
            scales["own_model"] = Scale(self.own.scale_of(own), self.own.scale())
        return scales

    def _same_before(self, peer: str, round: int) -> bool:
        """Whether `peer` runs our model, as its MODELs of rounds before `round` said. Not this
        round's: one may come before the node publishes (a slower local step), and what it sends
        would then depend on the timing; the simulator, where none comes first, would send
        otherwise (a deployed fleet ended two test images from its rehearsal)."""
        since, same = self.same_model.get(peer, (round, False))
        return same and since < round

    def keep(self, peer: str, round: int, body: Body, frame: Frame | None) -> None:
        if isinstance(body, Model):
            arch = body.tensors.get(ARCH_KEY)
            same = arch is not None and np.array_equal(arch, self.arch)
            held = self.same_model.get(peer)
            if held is None or held[1] != same or round < held[0]:
                self.same_model[peer] = (round, same)
        super().keep(peer, round, body, frame)

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.same_model = {peer: same for peer, same in self.same_model.items() if peer in self.peers}

    # -- aggregation ------------------------------------------------------------------------

    def end_round(self, round: int) -> None:
        super().end_round(round)  # graph step, prototypes, the small model
        self._mix_own(round)
        if self.graph.learning(round):
            others = sum(weight for peer, weight in self.graph.weights().items() if peer != self.node_id)
            self.alone = others < SHARED_MIN
        self._choose()

    def _mix_own(self, round: int) -> None:
        models, row = self.mixing(MessageType.MODEL, round)
        owns = {peer: own for peer, body in models.items() if (own := split_model(body)[2])}
        weights = self._own_weights((self.node_id, *owns), row)
        # Whether it is shared this round: the small model then teaches it only where it is better.
        self.mixes_own = sum(weight for peer, weight in weights.items() if peer in owns) >= SHARED_MIN
        self.own_mixed_with = sum(1 for peer in owns if weights.get(peer, 0.0) > 0)
        if not any(weights.get(peer, 0.0) > 0 for peer in owns):
            return
        others = [
            (weight, Model(kind="params", tensors=owns[peer])) for peer, weight in weights.items() if peer in owns
        ]
        self.own.mix(weights.get(self.node_id, 0.0), others)

    def _own_weights(self, members: tuple[str, ...], row: dict[str, float]) -> dict[str, float]:
        """The own model's mix over `members` (the node first): `own_uniform_share` of equal
        shares over those not distrusted, the rest of `row` renormalised over them."""
        distrusted = self.guard.distrusted()  # out of the equal shares, as the learned row leaves them out
        return _blend(
            _normalised({peer: row.get(peer, 0.0) for peer in members}),
            _normalised({peer: 1.0 for peer in members if peer not in distrusted}),
            self.config.own_uniform_share,
        )

    def state_dict(self) -> dict[str, Any]:
        same_model = {peer: [since, same] for peer, (since, same) in self.same_model.items()}
        state = {**super().state_dict(), "mixes_own": self.mixes_own, "same_model": same_model}
        state["own_mixed_with"], state["alone"] = self.own_mixed_with, self.alone
        if self.local is not None:
            state["local"] = self.local.state_dict()
        state["chooser"], state["chosen_on"] = self.chooser.state_dict(), self._chosen_on()
        if self.choice is not None:
            state["choice"] = self.choice.to_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.mixes_own = bool(state.get("mixes_own", False))
        self.own_mixed_with = int(state.get("own_mixed_with", 0))
        self.same_model = {str(peer): _verdict(held) for peer, held in state.get("same_model", {}).items()}
        self.alone = None if state.get("alone") is None else bool(state["alone"])
        if self.local is not None and "local" in state:
            self.local.load_state_dict(state["local"])
        elif self.held_out is not None:
            raise ValueError("the saved state has no local model: it was saved with validation_fraction = 0")
        # Else saved before keep_local: the local-only model starts afresh.
        # A window and a choice made on other images (a checkpoint of the other way to choose,
        # or of held-out images before `chosen_on` was kept) start afresh.
        same_images = state.get("chosen_on", "held_out" if "local" in state else None) == self._chosen_on()
        self.chooser.load_state_dict(state.get("chooser", []) if same_images else [])
        self.choice = Choice.from_dict(state["choice"]) if same_images and "choice" in state else None

    def _chosen_on(self) -> str:
        return "held_out" if self.held_out is not None else "training"


def _verdict(held: Any) -> tuple[int, bool]:
    """A saved `same_model` entry: [round, same], or a bare bool (checkpoints before the round was kept)."""
    return (-1, bool(held)) if isinstance(held, bool) else (int(held[0]), bool(held[1]))


def _effective(weights: dict[str, float]) -> float:
    """The effective number of members of a mix (1 / Σ w², w summing to 1): how many nodes'
    images a model mixed with these weights learned from, counted as equal shares; 1 for none."""
    squares = sum(weight * weight for weight in weights.values())
    return 1.0 / squares if squares > 0 else 1.0


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {peer: weight / total for peer, weight in weights.items()} if total > 0 else {}


def _blend(learned: dict[str, float], uniform: dict[str, float], share: float) -> dict[str, float]:
    """share · uniform + (1 − share) · learned; the one present where the other is empty."""
    if share in (0, 1) or not learned or not uniform:
        return uniform if share == 1 or not learned else learned
    peers = learned.keys() | uniform.keys()
    return {peer: share * uniform.get(peer, 0.0) + (1 - share) * learned.get(peer, 0.0) for peer in peers}
