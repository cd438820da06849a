"""Scores of published models, exchanged between peers: SCooL's E-step input, over the wire.

A node publishes its model; each receiver scores it on its own data and answers with a signed
SCORE naming the frame it scored. This helper keeps the bookkeeping that makes those answers
trustworthy and bounded, apart from any learning maths:

- which frame carried this node's model of which round to which peers, so that a score is taken
  only from a peer the model was sent to, in that frame, for that round, and only once;
- the models received and not yet scored (the answers this node owes);
- this node's own models of the last few rounds, to send to a peer that kept this node after
  pruning although this node did not keep it;
- this node's own scores of the peers' models (what it answered), to check a peer's word about
  this node's model against what that peer's model does on this node's data.

State is kept for `history` rounds at most.
"""

from __future__ import annotations

from protocol.identity import node_id as node_id_of
from protocol.messages import Model, Score

from ..interface import Frame, PayloadRejected

__all__ = ["ScoreExchange", "HISTORY"]

HISTORY = 3  # rounds of sent-model records, own models and scores kept


class ScoreExchange:
    def __init__(self, node_id: str, history: int = HISTORY) -> None:
        self.node_id = node_id
        self.history = history
        self.sent: dict[int, dict[int, frozenset[str]]] = {}  # round → frame seq → peers it went to
        self.own_models: dict[int, Model] = {}  # what this node published, by round
        self.scores: dict[int, dict[str, float]] = {}  # round → peer → log-likelihood per sample
        self.pending: list[tuple[str, int, Frame, Model]] = []  # models owed a SCORE
        self.checks: dict[int, dict[str, float]] = {}  # round → peer → its model on our data, per sample

    # --- this node's models --------------------------------------------------------------

    def remember_own(self, round: int, body: Model) -> None:
        self.own_models[round] = body

    def own_model(self, round: int) -> Model | None:
        return self.own_models.get(round)

    def sent_model(self, round: int, seq: int, to: tuple[str, ...]) -> None:
        """This node's model of `round` went to `to` in the frame numbered `seq`."""
        self.sent.setdefault(round, {})[seq] = frozenset(to)

    def sent_to(self, round: int) -> set[str]:
        return set().union(*self.sent.get(round, {}).values())

    # --- scores about them ---------------------------------------------------------------

    def take_score(self, peer: str, round: int, body: Score) -> None:
        """A peer's score of this node's model; raises PayloadRejected unless it answers a frame
        this node sent that peer, for that round, for the first time."""
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

    def scores_of(self, round: int) -> dict[str, float]:
        return self.scores.get(round, {})

    def checked(self, peer: str, round: int, per_sample: float) -> None:
        """This node scored `peer`'s model of `round` on its own data: `per_sample` nats."""
        self.checks.setdefault(round, {})[peer] = per_sample

    def check_of(self, peer: str, round: int) -> float | None:
        return self.checks.get(round, {}).get(peer)

    # --- scores this node owes -----------------------------------------------------------

    def owe(self, peer: str, round: int, frame: Frame, body: Model) -> None:
        self.pending.append((peer, round, frame, body))

    def take_owed(self) -> list[tuple[str, int, Frame, Model]]:
        owed, self.pending = self.pending, []
        return owed

    def forget_before(self, round: int) -> None:
        """Keep the last `history` rounds up to `round`."""
        oldest = round - self.history
        self.scores = {r: s for r, s in self.scores.items() if r > oldest}
        self.sent = {r: s for r, s in self.sent.items() if r > oldest}
        self.own_models = {r: m for r, m in self.own_models.items() if r > oldest}
        self.checks = {r: c for r, c in self.checks.items() if r > oldest}
