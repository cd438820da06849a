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
- End of round: the small model is mixed as in MAPL-Dual; the own backbone and projector with
  equal weights over the node and the peers that sent theirs (`own_mixing`: the features are
  shared by all who can share them; what is personal, the head and prototypes, follows the
  learned graph). A node alone with its architecture is MAPL-Dual.
- Every node starts its own model from the network's shared seed, so same-model nodes start
  alike and their average is a model from the first round (with separate starts, the average
  of the first rounds mixed unrelated features: digits, 8 rounds, the convnet nodes ended at
  53 and 77 % against Local's 79 and 88).
- It predicts with its own model once that is mixed, with MAPL-Dual's ensemble until then
  (`predict = "auto"`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from protocol.messages import Body, MessageType, Model

from ..outliers import Scale
from ..payloads import SharedModules
from ..seam import Frame, NodeSetup, Outbound, PayloadRejected
from .dual import PREDICTORS, DualConfig, DualPredictors, MaplDual

__all__ = ["ARCH_KEY", "AutoConfig", "MaplAuto", "OWN_PREFIX"]

ARCH_KEY = "arch"
OWN_PREFIX = "own."
ARCH_BYTES = 16
OWN_MIXING = ("learned", "uniform")


@dataclass(frozen=True)
class AutoConfig(DualConfig):
    # The own backbone and projector go to same-model peers every round (MAPL+ sends them to all)
    # or, with false, only once warm-up ends and then to the learned neighbours and explored peers.
    own_during_warmup: bool = True
    # How the own backbone is mixed: "uniform" (equal weights over the node and every same-model
    # peer that sent its own: the backbone is shared by all of them, sent to each every round,
    # and only the head, prototypes and small model follow the learned graph, as FedRep shares a
    # representation) or "learned" (the learned row, renormalised over the node and the
    # same-model peers that sent theirs). Own model's accuracy, mnist5k, 4 nodes, one backbone,
    # 40 rounds, seeds 0 / 1 / 2: uniform 94.5 / 94.8 / 95.1, learned 93.6 / 94.6 / 94.6 (MAPL+
    # 94.0 / 96.1 / 96.0, Local 92.4 / 92.9 / 91.2).
    own_mixing: str = "uniform"
    # "auto": the own model (`personal`) once its backbone is mixed with a same-model neighbour's,
    # the ensemble of the own and the small model until then (and on a node alone with its model).
    # On one backbone everywhere the ensemble was 1.4-2.0 points below the own model (mnist5k,
    # 4 nodes, 40 rounds, seeds 0-2): the small model, 5-7 points weaker, pulls it down.
    predict: str = "auto"
    predict_choices: ClassVar[tuple[str, ...]] = (*PREDICTORS, "auto")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.own_mixing not in OWN_MIXING:
            raise ValueError(f"own_mixing must be one of {', '.join(OWN_MIXING)}, got {self.own_mixing!r}")


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


class MaplAuto(MaplDual):
    """MAPL-Dual, plus MAPL+'s backbone averaging with the peers whose own model is the same."""

    name = "mapl-auto"
    config_type = AutoConfig
    shared_start = True  # same-model nodes average their backbones from the first round

    def __init__(self, setup: NodeSetup, config: AutoConfig | None = None) -> None:
        super().__init__(setup, config or AutoConfig())
        self.own = SharedModules({"backbone": self.model.backbone, "projector": self.model.projector})
        self.arch = architecture(self.own)
        self.same_model: dict[str, bool] = {}  # peer → whether its latest MODEL announced our architecture
        self.mixes_own = False  # whether the own backbone has been mixed with a peer's

    # -- publish and receive ----------------------------------------------------------------

    def publish(self, round: int) -> list[Outbound]:
        out = super().publish(round)  # prototypes and the small model, to the same peers
        if not out:
            return out
        small = out.pop()
        recipients = small.to
        if self.config.own_mixing == "uniform":  # every same-model peer, neighbour or not
            same = tuple(sorted(peer for peer in self.peers if self.same_model.get(peer)))
            recipients = tuple(sorted({*recipients, *same}))
        elif self.graph.learning(round) or self.config.own_during_warmup:
            same = tuple(peer for peer in recipients if self.same_model.get(peer))
        else:
            same = ()
        tensors = {**small.body.tensors, ARCH_KEY: self.arch}
        own = {f"{OWN_PREFIX}{name}": array for name, array in self.own.body().tensors.items()}
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

    def keep(self, peer: str, round: int, body: Body, frame: Frame | None) -> None:
        if isinstance(body, Model):
            arch = body.tensors.get(ARCH_KEY)
            self.same_model[peer] = arch is not None and np.array_equal(arch, self.arch)
        super().keep(peer, round, body, frame)

    def set_peers(self, peers) -> None:
        super().set_peers(peers)
        self.same_model = {peer: same for peer, same in self.same_model.items() if peer in self.peers}

    def predictors(self) -> DualPredictors:
        chosen = self.config.predict
        if chosen == "auto":
            chosen = "personal" if self.mixes_own else "ensemble"
        return DualPredictors(self.model, self.small, chosen)

    # -- aggregation ------------------------------------------------------------------------

    def end_round(self, round: int) -> None:
        super().end_round(round)  # graph step, prototypes, the small model
        models, mix = self.mixing(MessageType.MODEL, round)
        own_weight = mix.pop(self.node_id)
        if self.config.own_mixing == "uniform":  # not the learned row, but never a distrusted peer
            own_weight, distrusted = 1.0, self.guard.distrusted()
            mix = {peer: 1.0 for peer, body in models.items() if split_model(body)[2] and peer not in distrusted}
        same = {peer: weight for peer, weight in mix.items() if split_model(models[peer])[2]}
        total = own_weight + sum(same.values())
        if not same or total <= 0:
            return
        self.mixes_own = True
        others = [
            (weight / total, Model(kind="params", tensors=split_model(models[peer])[2]))
            for peer, weight in same.items()
        ]
        self.own.mix(own_weight / total, others)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "mixes_own": self.mixes_own, "same_model": dict(self.same_model)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.mixes_own = bool(state.get("mixes_own", False))
        self.same_model = {str(peer): bool(same) for peer, same in state.get("same_model", {}).items()}
