"""What a learning round decides and records, without I/O: the round driver's state machine.

`RoundState` holds what the daemon's round driver (learning.py) knows between its I/O calls:
the bounded queue of payloads that arrived, which peers sent every payload type the algorithm
waits for in which round, the gather of the round in progress (quorum, grace, deadline), and
whether the node should skip ahead to where its peers are. Time is handed in as numbers, so it
is tested on simulated time (tests/test_rounds.py), like `Membership` for discovery.

`RoundRecord` is what every driver emits per node and round, the daemon and the simulator alike;
testnet/report.py builds every report from these records.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from protocol import MessageType

__all__ = ["RoundRecord", "RoundState", "Gather", "ROUND_AHEAD", "INBOX_FULL", "arrived"]

ROUND_AHEAD = "round_ahead"  # a payload too far ahead of this node's round
INBOX_FULL = "inbox_full"  # the bounded payload queue was full

Item = TypeVar("Item")


@dataclass(frozen=True)
class RoundRecord:
    """One node's round: how it did, whom it weighed, what it waited for and sent, how long it took."""

    node: str
    round: int
    accuracy: float  # on the node's own test split
    own_class_accuracy: float  # the prediction restricted to the node's own classes
    loss: float  # mean training loss of the local step
    test_loss: float
    weights: Mapping[str, float]  # the node's row of W, itself included
    expected: int  # peers whose payloads the round waited for ...
    arrived: int  # ... and how many of them sent all of them in time
    missing: tuple[str, ...]  # the expected peers that did not
    recipients: int  # distinct peers this node sent anything to in the round
    sent: Mapping[str, tuple[int, int, int]]  # learning frames sent so far, by type: (messages, bytes, payload bytes)
    step_s: float  # the local step
    gather_s: float | None = None  # waiting for the neighbours (None: no network, as in the simulator)
    round_s: float | None = None  # the whole round, checkpoint included (None: not measured alone)
    accuracy_by_predictor: Mapping[str, float] = field(default_factory=dict)  # where a node has several
    test_samples: int = 0  # images in the node's test split: the n of its accuracy's interval (0: unknown)
    # discovery and keep-alive frames sent so far, by type, shaped as `sent` (no payload bytes)
    discovery_sent: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (status, checkpoints)."""
        return {
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "weights": dict(self.weights),
            "missing": list(self.missing),
            "sent": {kind: list(counts) for kind, counts in self.sent.items()},
            "discovery_sent": {kind: list(counts) for kind, counts in self.discovery_sent.items()},
            "accuracy_by_predictor": dict(self.accuracy_by_predictor),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """The inverse of `to_dict`; raises ValueError for a record of another shape."""
        try:
            return cls(
                **{
                    **data,
                    "missing": tuple(data["missing"]),
                    "sent": _counts(data["sent"]),
                    "discovery_sent": _counts(data.get("discovery_sent", {})),
                }
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a round record: {exc}") from None

    @property
    def messages_out(self) -> int:
        return sum(messages for messages, _, _ in self.sent.values())

    @property
    def bytes_out(self) -> int:
        return sum(size for _, size, _ in self.sent.values())


def _counts(by_type: Mapping[str, Any]) -> dict[str, tuple[int, int, int]]:
    return {str(kind): (int(m), int(b), int(p)) for kind, (m, b, p) in by_type.items()}


def arrived(heard: Mapping[str, set[MessageType]], waits_for: frozenset[MessageType]) -> set[str]:
    """Peers that sent every payload type in `waits_for` (any one, if it is empty)."""
    return {peer for peer, kinds in heard.items() if kinds and kinds >= waits_for}


@dataclass
class Gather:
    """Waiting for the expected peers' payloads of one round: all of them, but once a quorum is
    in only `grace_s` longer, and never past the deadline. A peer that stopped sending (its
    weight for us went to zero, or it died) costs one grace period, not a deadline."""

    expected: frozenset[str]
    needed: int  # the quorum, in peers
    deadline: float
    grace_s: float
    grace_until: float | None = None

    def finished(self, arrived: set[str], now: float) -> bool:
        count = len(self.expected & arrived)
        if count >= len(self.expected) or now >= self.deadline:
            return True
        if count >= self.needed and self.grace_until is None:
            self.grace_until = now + self.grace_s
        return self.grace_until is not None and now >= self.grace_until

    def wake_at(self) -> float:
        """When `finished` turns true at the latest if nothing more arrives."""
        return self.deadline if self.grace_until is None else min(self.deadline, self.grace_until)


@dataclass
class _Queued(Generic[Item]):
    round: int
    peer: str
    item: Item


@dataclass
class RoundState(Generic[Item]):
    """The round in progress and the payloads around it. `Item` is whatever the driver queues
    (the daemon: the verified envelope)."""

    waits_for: frozenset[MessageType]
    rounds: int
    max_rounds_ahead: int
    inbox_frames: int
    history_rounds: int
    round: int = 0  # the round in progress (or next, between rounds)
    # Rounds completed: the last one finished + 1 (rounds a catch-up skipped count too).
    # `status` and Prometheus both show this one number.
    completed: int = 0
    catch_ups: int = 0
    resumed_from: int | None = None
    missing: Counter[str] = field(default_factory=Counter)  # expected payloads that did not arrive, by peer
    history: deque[RoundRecord] = field(init=False)
    _inbox: list[_Queued[Item]] = field(default_factory=list)
    _heard: dict[int, dict[str, set[MessageType]]] = field(default_factory=dict)  # round → peer → types
    _peer_round: dict[str, int] = field(default_factory=dict)  # latest round each peer sent a payload for
    _heard_this_round: set[str] = field(default_factory=set)  # peers heard from since the last round ended

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.history_rounds)

    # --- payloads ------------------------------------------------------------------------

    def offer(self, peer: str, round: int, kind: MessageType, item: Item) -> str | None:
        """Queue a payload from `peer` for `round`; returns the reason it was refused, if it was."""
        self._peer_round[peer] = max(round, self._peer_round.get(peer, -1))
        self._heard_this_round.add(peer)
        if round > self.round + self.max_rounds_ahead:
            return ROUND_AHEAD
        if len(self._inbox) >= self.inbox_frames:
            return INBOX_FULL
        self._inbox.append(_Queued(round, peer, item))
        self._heard.setdefault(round, {}).setdefault(peer, set()).add(kind)
        return None

    def due(self) -> list[tuple[str, int, Item]]:
        """The queued payloads of this round or earlier, as (peer, round, item), in arrival
        order; later ones stay queued."""
        due = [entry for entry in self._inbox if entry.round <= self.round]
        self._inbox = [entry for entry in self._inbox if entry.round > self.round]
        return [(entry.peer, entry.round, entry.item) for entry in due]

    @property
    def queued(self) -> int:
        return len(self._inbox)

    def arrived(self, round: int) -> set[str]:
        return arrived(self._heard.get(round, {}), self.waits_for)

    def settled(self, round: int) -> set[str]:
        """Peers not worth waiting for any more in `round`: those that arrived, and those already
        heard from in a later round (a peer sends its rounds in order on one connection, so what
        it sent for `round` is in, or will never come)."""
        passed = {peer for peer, latest in self._peer_round.items() if latest > round}
        return self.arrived(round) | passed

    # --- the round -----------------------------------------------------------------------

    def gather(
        self,
        expected: Iterable[str],
        now: float,
        *,
        quorum: float,
        deadline_s: float,
        grace_s: float,
        hold_until: float = -math.inf,
    ) -> Gather:
        """Start waiting, at `now`, for the round's payloads from `expected`, until `deadline_s`
        from now or `hold_until`, whichever is later (the first round: peers may still be loading
        their data and model)."""
        peers = frozenset(expected)
        return Gather(peers, math.ceil(quorum * len(peers)), max(now + deadline_s, hold_until), grace_s)

    def finish(self, record: RoundRecord) -> None:
        """The round of `record` is done: count who was missing, keep the record, forget what
        was heard for it."""
        self.missing.update(record.missing)
        self.history.append(record)
        self._heard = {r: peers for r, peers in self._heard.items() if r > record.round}
        self.completed = record.round + 1

    def next_round(self, weights: Mapping[str, float]) -> int:
        """round + 1, unless the peers this node learns from are further ahead than the queue
        reaches (it was down, or it is much slower): then it joins them instead of replaying
        rounds whose payloads are gone. Peers it does not learn from (another cluster, say)
        may run at their own pace and do not pull it along."""
        heard, self._heard_this_round = self._heard_this_round, set()
        following = self.completed
        sources = [peer for peer in heard if weights.get(peer, 0.0) > 0] or list(heard)
        if sources:
            typical = int(statistics.median_low(self._peer_round[peer] for peer in sources))
            if typical > following + self.max_rounds_ahead:
                self.catch_ups += 1
                following = typical
        self.round = following
        return following

    @property
    def done(self) -> bool:
        return self.round >= self.rounds

    def resume(self, last_round: int, history: Iterable[RoundRecord]) -> None:
        """Continue after round `last_round`, from a checkpoint."""
        self.history.extend(history)
        self.completed = self.round = last_round + 1
        self.resumed_from = last_round
