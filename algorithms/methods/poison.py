"""A Byzantine learning peer, for measuring how the learned graphs cope with one.

`PoisoningNode` wraps any algorithm: it trains, listens and aggregates as that algorithm does,
but every learning payload it sends (`publish` and `respond`) passes through `corrupt` first:
prototypes and the head riding with them, HEAD bodies, and every tensor of a MODEL (parameters,
BatchNorm statistics, the update, whatever a prior adds). Scores are sent as computed: a peer
that lies about its own data is another attack than one that poisons what it shares.

Attacks, per tensor:
- `scale`: × factor. Past the wire's norm bound (protocol.Limits.max_tensor_norm) honest
  decoders refuse the frame, so only factors that stay under it test the learning side.
- `rescale`: × factor, but a tensor that would pass the wire's norm bound is brought back
  just under it: every frame is legal, whatever the factor, so the learning side alone must
  refuse it.
- `sign-flip`: negated.
- `random`: Gaussian noise with the honest tensor's L2 norm, so no norm bound can tell it apart.
- `rotate`: each class's prototype and head row (a model's `head.*` rows too) sent as the next
  class's: every scale and every row honest, each in the wrong place.
- `copy`: the latest payload of the same type it received from any peer, sent as its own (its
  own signature, its own round): a peer passing off another's work. Before it has one, its own.
- `none`: sent as is; the control twin of a poisoned run (same nodes, same measurements).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol.limits import DEFAULT_LIMITS
from protocol.messages import Body, Head, Model, Prototypes

from ..catalog import ATTACKS
from ..interface import Algorithm, Evaluation, Frame, LocalReport, Outbound, Predictors, Staleness

__all__ = ["ATTACKS", "LEGAL_NORM", "Attack", "corrupt_tensor", "corrupt", "PoisoningNode"]

# The largest norm `rescale` sends: just under the honest decoders' default bound.
LEGAL_NORM = 0.99 * DEFAULT_LIMITS.max_tensor_norm


@dataclass(frozen=True)
class Attack:
    kind: str = "sign-flip"
    factor: float = 10.0  # for `scale` and `rescale`

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"unknown attack {self.kind!r}; choose from {', '.join(ATTACKS)}")
        if not (math.isfinite(self.factor) and self.factor != 0):
            raise ValueError(f"attack factor must be finite and non-zero, got {self.factor}")


def corrupt_tensor(array: np.ndarray, attack: Attack, rng: np.random.Generator) -> np.ndarray:
    """`array` poisoned by `attack`: the same shape, and the same dtype unless a scaled value no
    longer fits it (float16), then float32. Integer tensors pass unchanged: they are counts."""
    if array.dtype.kind != "f" or attack.kind == "none":
        return array
    wide = array.astype(np.float64)
    if attack.kind == "scale":
        poisoned = wide * attack.factor
    elif attack.kind == "rescale":
        honest = float(np.linalg.norm(wide))
        # The factor, or less where the norm would pass the bound (computed without overflowing).
        factor = min(abs(attack.factor), LEGAL_NORM / honest if honest > 0 else math.inf)
        poisoned = wide * math.copysign(factor, attack.factor)
    elif attack.kind == "sign-flip":
        poisoned = -wide
    else:
        noise = rng.standard_normal(array.shape)
        scale = np.linalg.norm(wide) / max(float(np.linalg.norm(noise)), 1e-300)
        poisoned = noise * scale
    fits = np.abs(poisoned).max(initial=0.0) <= np.finfo(array.dtype).max
    with np.errstate(over="ignore"):  # past float32 it becomes Inf, as an attacker may send: the signer refuses it
        return poisoned.astype(array.dtype if fits else np.float32)


def rotate_classes(array: np.ndarray) -> np.ndarray:
    """Each class's row as the next class's (rows are classes)."""
    return np.roll(array, 1, axis=0)


def _each_tensor(body: Body, change: Callable[[str, np.ndarray], np.ndarray]) -> Body:
    """`body` with `change(name, tensor)` applied to each of its learning tensors: a model's by
    their names, a head's as `head.weight` and `head.bias`, prototypes' as `prototypes` and the
    head riding with them as `head`; other bodies (scores) unchanged."""

    def one(name: str, tensor: np.ndarray | None) -> np.ndarray | None:
        return None if tensor is None else change(name, tensor)

    def each(tensors: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        return None if tensors is None else {name: change(name, t) for name, t in tensors.items()}

    if isinstance(body, Prototypes):
        return dataclasses.replace(body, prototypes=one("prototypes", body.prototypes), head=one("head", body.head))
    if isinstance(body, Head):
        return dataclasses.replace(body, weight=one("head.weight", body.weight), bias=one("head.bias", body.bias))
    if isinstance(body, Model):
        return dataclasses.replace(body, tensors=each(body.tensors), update=each(body.update))
    return body


def _by_class(name: str) -> bool:
    """Whether a tensor's rows are classes: prototypes, a head's weight and bias."""
    return name in ("prototypes", "head") or name.split(".")[-2:-1] == ["head"]


def corrupt(body: Body, attack: Attack, rng: np.random.Generator) -> Body:
    """`body` with every learning tensor poisoned; other bodies (scores) unchanged. (`copy`
    replaces whole payloads: PoisoningNode.)"""
    if attack.kind == "copy":
        return body
    if attack.kind == "rotate":
        return _each_tensor(body, lambda name, t: rotate_classes(t) if _by_class(name) else t)
    return _each_tensor(body, lambda _, t: corrupt_tensor(t, attack, rng))


class PoisoningNode(Algorithm):
    """`inner` as it is, except that what it sends is poisoned by `attack`."""

    name = "poisoning"
    config_type = type(None)

    def __init__(self, inner: Algorithm, attack: Attack, seed: int) -> None:
        super().__init__(inner.setup)
        self.inner = inner
        self.attack = attack
        self.rng = np.random.default_rng([seed, 14])
        # The drivers read these from the node: it must look like the algorithm it wraps.
        self.name = inner.name  # type: ignore[misc]
        self.sends = inner.sends  # type: ignore[misc]
        self.waits_for = inner.waits_for  # type: ignore[misc]
        self._copied: dict[Any, Body] = {}  # `copy`: the latest payload received, by type

    def _poisoned(self, outs: Iterable[Outbound]) -> list[Outbound]:
        if self.attack.kind == "copy":
            return [dataclasses.replace(out, body=self._copied.get(out.body.TYPE, out.body)) for out in outs]
        return [dataclasses.replace(out, body=corrupt(out.body, self.attack, self.rng)) for out in outs]

    def set_peers(self, peers: Iterable[str]) -> None:
        self.inner.set_peers(peers)
        self.peers = self.inner.peers

    def set_staleness(self, staleness: Staleness) -> None:
        self.inner.set_staleness(staleness)

    def local_step(self, round: int) -> LocalReport:
        return self.inner.local_step(round)

    def publish(self, round: int) -> list[Outbound]:
        return self._poisoned(self.inner.publish(round))

    def published(self, round: int, out: Outbound, seq: int) -> None:
        self.inner.published(round, out, seq)

    def receive(self, peer: str, round: int, body: Body, frame: Frame | None = None) -> None:
        self._copied[body.TYPE] = body
        self.inner.receive(peer, round, body, frame)

    def respond(self) -> list[Outbound]:
        return self._poisoned(self.inner.respond())

    def expected(self, round: int) -> tuple[str, ...]:
        return self.inner.expected(round)

    def end_round(self, round: int) -> None:
        self.inner.end_round(round)

    def evaluate(self) -> Evaluation:
        return self.inner.evaluate()

    def predictors(self) -> Predictors:
        return self.inner.predictors()

    def weights(self) -> dict[str, float]:
        return self.inner.weights()

    def latest_rounds(self) -> dict[str, int]:
        return self.inner.latest_rounds()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
