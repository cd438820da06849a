"""What a learning round decides and records, without I/O: the round driver's state machine.

`RoundState` holds what the daemon's round driver (learning.py) knows between its I/O calls:
the bounded queue of payloads that arrived (bounded per peer too), which peers sent every payload
type the algorithm waits for in which round, the gather of the round in progress (quorum, grace,
deadline), and whether a node that was down should skip the rounds it missed. Time is handed in
as numbers, so it is tested on simulated time (tests/test_rounds.py), like `Membership` for
discovery.

`RoundRecord` is what every driver emits per node and round, the daemon and the simulator alike;
testnet/reporting/report.py builds every report from these records.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from protocol import UNEXPECTED_TYPE, MessageType

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = [
    "RoundRecord",
    "right_bits",
    "right_from_bits",
    "served_because",
    "RoundState",
    "Gather",
    "Schedule",
    "AdaptiveDeadline",
    "Progress",
    "SYNC",
    "ASYNC",
    "FIXED",
    "ADAPTIVE",
    "ROUND_AHEAD",
    "INBOX_FULL",
    "PEER_INBOX_FULL",
    "DUPLICATE_PAYLOAD",
    "CATCH_UP_MIN_PEERS",
    "PACE_ROUNDS",
    "arrived",
]

ROUND_AHEAD = "round_ahead"  # a payload too far ahead of this node's round
INBOX_FULL = "inbox_full"  # the bounded payload queue was full
PEER_INBOX_FULL = "peer_inbox_full"  # its sender already holds its share of the queue
DUPLICATE_PAYLOAD = "duplicate_payload"  # a second payload of one type for one round from one peer
# A catch-up needs the word of at least this many distinct peers, whatever the quorum fraction:
# one peer, however far ahead it says it is, never moves a node's round.
CATCH_UP_MIN_PEERS = 2
# A node's pace: the median duration of its last this many rounds (`RoundState.allowance`).
PACE_ROUNDS = 20

SYNC, ASYNC = "sync", "async"  # `[algorithm].schedule`
FIXED, ADAPTIVE = "fixed", "adaptive"  # `[algorithm].deadline`
# A peer's arrival delays say nothing until it has this many: until then it gets the fixed deadline.
ADAPTIVE_MIN_SAMPLES = 3

Item = TypeVar("Item")


@dataclass(frozen=True)
class Schedule:
    """How a node's rounds wait for each other (`[algorithm]`: schedule, async_gather_s,
    staleness_decay, max_staleness, overtime_rounds, deadline, deadline_mads, deadline_window,
    deadline_min_s).

    "sync": a round's gather waits for the expected neighbours' payloads of that round (quorum,
    grace, deadline: `Gather`), the deadline fixed or adaptive (`AdaptiveDeadline`). "async": the
    gather lasts `async_gather_s` at most, payloads of any round are taken and handed on at once,
    and the algorithm mixes the latest payload of each neighbour, weighted λ^age
    (algorithms/interface.py `Staleness`); a node never catches up by skipping rounds."""

    schedule: str = SYNC
    # tuned on the stragglers benchmark's seed 0 (BENCHMARKS.md "Stragglers"): of 0.05, 0.1 and
    # 0.2 s (a simulated round there takes 0.1-0.17 s), 0.1 s kept the most nodes within a point
    # of sync and the fast nodes' time within the goal; 0.05 s let the quicker backbones outrun
    # their neighbours' payloads
    async_gather_s: float = 0.1
    # tuned there too, with the gather at 0.05 s: the only λ tried that met both the time and the
    # slow nodes' goals, though every one was within that seed's noise of the others
    staleness_decay: float = 0.9
    # 40 dropped a 5×-slower cluster-mate from a fast node's neighbourhood at about its round 50
    # (the mate then ~40 rounds behind) and the fast node ended up to 2.75 points below sync; at
    # 80 the mate stays (weighed λ^age) and holds the fast node in overtime: no node more than
    # a point below sync on seeds 0-3 (BENCHMARKS.md "Stragglers")
    max_staleness: int = 80
    # async: rounds a node may run past `rounds` while a neighbour it weighs is still at it
    # (RoundEngine.done); 0: every node ends at `rounds`
    overtime_rounds: int = 40
    deadline: str = FIXED
    deadline_mads: float = 4.0
    deadline_window: int = 20
    deadline_min_s: float = 0.5

    def __post_init__(self) -> None:
        if self.schedule not in (SYNC, ASYNC) or self.deadline not in (FIXED, ADAPTIVE):
            raise ValueError(f"schedule sync|async and deadline fixed|adaptive, got {self.schedule}, {self.deadline}")
        if not (self.async_gather_s > 0 and 0 < self.staleness_decay <= 1 and self.max_staleness >= 0):
            raise ValueError("async_gather_s > 0, staleness_decay in (0, 1] and max_staleness ≥ 0")
        if self.overtime_rounds < 0:
            raise ValueError(f"overtime_rounds must be ≥ 0, got {self.overtime_rounds}")
        if not (self.deadline_mads >= 0 and self.deadline_window >= ADAPTIVE_MIN_SAMPLES and self.deadline_min_s > 0):
            raise ValueError(f"deadline_mads ≥ 0, deadline_window ≥ {ADAPTIVE_MIN_SAMPLES}, deadline_min_s > 0")

    @classmethod
    def of(cls, settings: Any) -> Schedule:
        """The schedule `[algorithm]` (p2pnode/learning/settings.py's `AlgorithmSettings`) sets."""
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})

    @property
    def asynchronous(self) -> bool:
        return self.schedule == ASYNC


def remember(by_peer: dict[str, Any], peer: str, value: Any, max_peers: int) -> None:
    """`by_peer[peer] = value` as the most recently observed peer (pop it first), forgetting the
    least recently observed ones past `max_peers`."""
    by_peer[peer] = value
    while len(by_peer) > max_peers:
        del by_peer[next(iter(by_peer))]


class AdaptiveDeadline:
    """The sync gather's deadline from each neighbour's observed arrival delays (seconds from the
    gather's start): per expected peer median + `mads` × MAD over its last `window` delays; the
    deadline is the largest of them, at least `floor_s` and at most the fixed deadline handed in.
    A peer with fewer than ADAPTIVE_MIN_SAMPLES delays gets the fixed deadline. Pure: delays come
    in as numbers. Bounded: `window` delays per peer, for at most `max_peers` peers (the least
    recently observed one is forgotten first)."""

    def __init__(self, window: int, mads: float, floor_s: float, max_peers: int = 4096) -> None:
        self.window, self.mads, self.floor_s, self.max_peers = window, mads, floor_s, max_peers
        self._delays: dict[str, deque[float]] = {}

    def observe(self, peer: str, delay_s: float) -> None:
        delays = self._delays.pop(peer, None) or deque(maxlen=self.window)
        delays.append(max(0.0, delay_s))
        remember(self._delays, peer, delays, self.max_peers)

    def expected_delay_s(self, peer: str) -> float | None:
        """median + mads × MAD of `peer`'s delays; None while it has too few."""
        delays = self._delays.get(peer, ())
        if len(delays) < ADAPTIVE_MIN_SAMPLES:
            return None
        median = statistics.median(delays)
        return median + self.mads * statistics.median(abs(delay - median) for delay in delays)

    def deadline_s(self, expected: Iterable[str], fixed_s: float) -> float:
        """How long to wait for `expected`: within [min(floor_s, fixed_s), fixed_s]."""
        per_peer = [self.expected_delay_s(peer) for peer in expected]
        if any(delay is None for delay in per_peer):
            return fixed_s
        return min(fixed_s, max([self.floor_s, *per_peer]))


class Progress:
    """How far each peer has shown it got, counted in this node's rounds: the first and the latest
    round of its payloads, and during which of this node's rounds each came. The async schedule's
    overtime asks it whether a neighbour still runs: at the pace it has shown (its rounds per
    ours), it has had time for fewer than `silent_rounds` rounds since its latest came. A neighbour
    that stopped sending to this node (it finished, or it no longer weighs this one) falls silent
    even though its latest round is behind; a slower one sends less often and keeps its standing;
    one that has shown a single round has shown no pace, and is taken as running (so is one never
    heard from: then `max_staleness` alone decides). A peer that restarted from an older
    checkpoint shows progress again once it passes the latest round it had sent. Bounded like
    `AdaptiveDeadline`: `max_peers` peers at most."""

    def __init__(self, silent_rounds: float = 3.0, max_peers: int = 4096) -> None:
        if not silent_rounds > 0:
            raise ValueError(f"silent_rounds must be > 0, got {silent_rounds}")
        self.silent_rounds, self.max_peers = silent_rounds, max_peers
        # peer -> (first round, ours when it came, latest round, ours when it came)
        self._seen: dict[str, tuple[int, int, int, int]] = {}

    def observe(self, peer: str, round: int, during: int) -> None:
        """A payload of `peer`'s round `round` came during this node's round `during`."""
        seen = self._seen.pop(peer, None)
        if seen is None:
            seen = (round, during, round, during)
        elif round > seen[2]:
            seen = (seen[0], seen[1], round, during)
        remember(self._seen, peer, seen, self.max_peers)

    def pace(self, peer: str) -> float | None:
        """`peer`'s rounds per ours, as its payloads showed them; None: fewer than two rounds shown."""
        first, first_at, latest, latest_at = self._seen.get(peer, (0, 0, 0, 0))
        return None if latest == first else (latest - first) / max(1, latest_at - first_at)

    def running(self, peer: str, now: int) -> bool:
        """Whether `peer` may still send to this node, now in its round `now`."""
        pace = self.pace(peer)
        return pace is None or (now - self._seen[peer][3]) * pace < self.silent_rounds


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
    predictor: str = ""  # ... the one `accuracy` is of, and the node predicts with ("" with only one)
    test_samples: int = 0  # images in the node's test split: the n of its accuracy's interval (0: unknown)
    # which of them the served predictor got right, as `right_bits` packs them ("": not recorded):
    # what pairs two methods image by image on a fleet too small for an interval over nodes
    test_right: str = ""
    # where the node chooses `predictor` on training images it held out: each predictor's accuracy
    # on them, and how many there were
    validation_by_predictor: Mapping[str, float] = field(default_factory=dict)
    validation_samples: int = 0
    # why the node serves `predictor`, where the algorithm decided it ("": no such reason)
    predictor_why: str = ""
    # discovery and keep-alive frames sent so far, by type, shaped as `sent` (no payload bytes)
    discovery_sent: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    # `[algorithm].local_baseline`: the local-only model trained beside this one on the same data
    # and split, evaluated in the same round (accuracy, own_class_accuracy, loss, test_loss,
    # since: the first round it trained; test_right, as above); empty without one
    local_baseline: Mapping[str, float | str] = field(default_factory=dict)
    # When the round ended, in seconds since the node's learning started: the daemon's real time
    # (from its first round), the simulator's simulated time (testnet/simulation/clock.py); None in records
    # written before it existed
    ended_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (status, checkpoints)."""
        return {
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "weights": dict(self.weights),
            "missing": list(self.missing),
            "sent": {kind: list(counts) for kind, counts in self.sent.items()},
            "discovery_sent": {kind: list(counts) for kind, counts in self.discovery_sent.items()},
            "accuracy_by_predictor": dict(self.accuracy_by_predictor),
            "validation_by_predictor": dict(self.validation_by_predictor),
            "local_baseline": dict(self.local_baseline),
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
    weight for us went to zero, or it died) costs one grace period, not a deadline; one that
    sent PASS for the round is settled at once."""

    expected: frozenset[str]
    needed: int  # the quorum, in peers
    deadline: float
    grace_s: float
    grace_until: float | None = None
    started: float = 0.0
    # When each expected peer was first seen arrived, in seconds from `started`, and the last
    # time looked (the delays `AdaptiveDeadline` learns from).
    arrived_after: dict[str, float] = field(default_factory=dict)
    looked: float = 0.0

    def finished(self, arrived: set[str], now: float) -> bool:
        self.looked = max(self.looked, now - self.started)
        for peer in self.expected & arrived:
            self.arrived_after.setdefault(peer, now - self.started)
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
    kind: MessageType
    item: Item


@dataclass
class RoundState(Generic[Item]):
    """The round in progress and the payloads around it. `Item` is whatever the driver queues
    (the daemon: the verified envelope)."""

    waits_for: frozenset[MessageType]
    rounds: int
    max_rounds_ahead: int
    inbox_frames: int
    peer_inbox_frames: int  # of `inbox_frames`, at most this many queued for any one peer
    catch_up_quorum: float  # the fraction of the peers it learns from that must be ahead to pull it along
    history_rounds: int
    round: int = 0  # the round in progress (or next, between rounds)
    # The payload types the algorithm takes, once it is built (None: not yet known, all queued).
    takes: frozenset[MessageType] | None = None
    # The async schedule (`Schedule`): payloads of any round are queued and all handed on at
    # once (the algorithm keeps the latest of each neighbour), and a node never catches up.
    asynchronous: bool = False
    # Rounds completed: the last one finished + 1 (rounds a catch-up skipped count too).
    # `status` and Prometheus both show this one number.
    completed: int = 0
    catch_ups: int = 0
    # Seconds this node was not running while its peers could: from its checkpoint to its
    # restart (the daemon's driver hands it in at resume). The only ground for skipping rounds.
    lost_s: float = 0.0
    skipped: int = 0  # rounds catch-ups skipped, in all
    # Async: queued payloads a later one of the same peer and type replaced before they were
    # handed on (the algorithm keeps only the latest of each), and late ones older than it.
    superseded: int = 0
    resumed_from: int | None = None
    missing: Counter[str] = field(default_factory=Counter)  # expected payloads that did not arrive, by peer
    history: deque[RoundRecord] = field(init=False)
    _inbox: list[_Queued[Item]] = field(default_factory=list)
    _held: Counter[str] = field(default_factory=Counter)  # queued payloads by peer
    _heard: dict[int, dict[str, set[MessageType]]] = field(default_factory=dict)  # round → peer → types queued
    _passed: dict[int, set[str]] = field(default_factory=dict)  # round → peers that sent PASS for it
    # The furthest round each peer says it has got to (a payload queued, or refused as too far
    # ahead): its word, which only settles it (`settled`) and points a node that was down where
    # to go within what it lost (`next_round`). Only rounds past the one in progress are kept.
    _reached: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.history_rounds)

    # --- payloads ------------------------------------------------------------------------

    def offer(self, peer: str, round: int, kind: MessageType, item: Item) -> str | None:
        """Queue a payload from `peer` for `round`; returns the reason it was refused, if it was.
        A refused payload leaves no trace, but for one thing: a payload too far ahead still says
        how far its sender says it got, which settles that sender alone (`settled`: it shortens a
        wait) and, among a quorum of peers, may point a node that was down where to go, never
        further than its own lost time allows (`next_round`). A peer sends one payload of each
        type per round, so a second is refused; and no peer holds more than its share of the
        queue, so neither copies nor old rounds from one peer crowd out the others' payloads."""
        if kind is MessageType.PASS:
            return self._pass(peer, round)
        if self.takes is not None and kind not in self.takes:
            return UNEXPECTED_TYPE  # never queued: a 60 MB MODEL to a MAPL node is dropped at once
        far_ahead = round > self.round + self.max_rounds_ahead
        if far_ahead and not self.asynchronous:
            self._note_reached(peer, round)
            return ROUND_AHEAD
        if kind in self._heard.get(round, {}).get(peer, ()):
            return DUPLICATE_PAYLOAD
        if self.asynchronous and not self._supersede(peer, round, kind):
            self._note_reached(peer, round)
            return None
        if self._held[peer] >= self.peer_inbox_frames:
            return PEER_INBOX_FULL
        if len(self._inbox) >= self.inbox_frames:
            return INBOX_FULL
        self._inbox.append(_Queued(round, peer, kind, item))
        self._held[peer] += 1
        if not far_ahead:  # so what is remembered of rounds ahead stays bounded, async too
            self._heard.setdefault(round, {}).setdefault(peer, set()).add(kind)
        self._note_reached(peer, round)
        return None

    def _pass(self, peer: str, round: int) -> str | None:
        """`peer` sends us nothing more in `round` (protocol PASS): settled for it at once. Only
        rounds from the one in progress to `max_rounds_ahead` past it are kept, one mark per peer."""
        if round > self.round + self.max_rounds_ahead:
            return ROUND_AHEAD
        if round >= max(self.round, self.completed):  # not a round already finished
            self._passed.setdefault(round, set()).add(peer)
            self._note_reached(peer, round)
        return None

    def passed(self, round: int) -> set[str]:
        """Peers that said they send nothing more in `round`: settled, not missing."""
        return set(self._passed.get(round, ()))

    def _supersede(self, peer: str, round: int, kind: MessageType) -> bool:
        """Async: a queued payload of `peer` and `kind` is replaced by one of a later (or the
        same) round, so the newest is what the algorithm gets and a fast peer never fills its
        share of the queue with rounds nobody will use; False if the one queued is the newer
        (this one arrived late). Either way the older one counts as `superseded`."""
        for index, entry in enumerate(self._inbox):
            if entry.peer == peer and entry.kind == kind:
                self.superseded += 1
                if entry.round > round:
                    return False
                del self._inbox[index]
                self._held[peer] -= 1
                return True
        return True

    def _note_reached(self, peer: str, round: int) -> None:
        if round > max(self.round, self._reached.get(peer, -1)):
            self._reached[peer] = round

    def due(self) -> list[tuple[str, int, Item]]:
        """The queued payloads of this round or earlier, as (peer, round, item), in arrival
        order; later ones stay queued (async: all are due, later rounds too)."""
        due = [entry for entry in self._inbox if entry.round <= self.round or self.asynchronous]
        self._inbox = [entry for entry in self._inbox if entry.round > self.round and not self.asynchronous]
        self._held = Counter(entry.peer for entry in self._inbox)
        return [(entry.peer, entry.round, entry.item) for entry in due]

    @property
    def queued(self) -> int:
        return len(self._inbox)

    def arrived(self, round: int) -> set[str]:
        return arrived(self._heard.get(round, {}), self.waits_for)

    def settled(self, round: int) -> set[str]:
        """Peers not worth waiting for any more in `round`: those that arrived, and those already
        heard from in a later round (a peer sends its rounds in order on one connection, so what
        it sent for `round` is in, or will never come). Sync, not one that sent part of `round`'s
        payloads: the rest may come on its other connection, later (transport.py: while its
        peers' connection opens, small frames go on the public one), and will count."""
        passed = {peer for peer, latest in self._reached.items() if latest > round}
        if not self.asynchronous:
            heard = self._heard.get(round, {})
            passed = {peer for peer in passed if not heard.get(peer)}
        return self.arrived(round) | passed | self.passed(round)

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
        deadline = max(now + deadline_s, hold_until)
        return Gather(peers, math.ceil(quorum * len(peers)), deadline, grace_s, started=now)

    def finish(self, record: RoundRecord) -> None:
        """The round of `record` is done: count who was missing, keep the record, forget what
        was heard for it."""
        self.missing.update(record.missing)
        self.history.append(record)
        self._heard = {r: peers for r, peers in self._heard.items() if r > record.round}
        self._passed = {r: peers for r, peers in self._passed.items() if r > record.round}
        self.completed = record.round + 1

    def next_round(self, sources: Collection[str]) -> int:
        """round + 1, or further only to make up for time this node lost: one that was down (its
        checkpoint older than its restart by `lost_s`) skips the rounds its peers ran meanwhile
        instead of replaying them alone. What its peers say is never the ground for a skip, only
        its bound: a node goes as far as `catch_up_quorum` of `sources` (the peers it learns
        from, never fewer than CATCH_UP_MIN_PEERS) have all reached, and no further than its own
        pace allows in the time it lost (`allowance`), nor past its last round. A node that ran
        without a break so skips nothing, whatever any number of its peers claim; one that was
        down skips at most the rounds it could have run meanwhile. Async, a node runs every round
        at its own pace and never skips."""
        following, sources = self.completed, set(sources)
        needed = max(CATCH_UP_MIN_PEERS, math.ceil(self.catch_up_quorum * len(sources)))
        reached = sorted((self._reached[peer] for peer in sources if peer in self._reached), reverse=True)
        if not self.asynchronous and len(reached) >= needed and reached[needed - 1] > following + self.max_rounds_ahead:
            target = min(reached[needed - 1], following + self.allowance(), self.rounds - 1)
            if target > following:
                self.catch_ups += 1
                self.skipped += target - following
                following = target
        self.round = following
        self._reached = {peer: latest for peer, latest in self._reached.items() if latest > following}
        return following

    def pace_s(self) -> float | None:
        """This node's own round duration: the median of its last PACE_ROUNDS rounds' (None
        before it has run one)."""
        durations = [record.round_s for record in list(self.history)[-PACE_ROUNDS:] if record.round_s]
        return statistics.median(durations) if durations else None

    def allowance(self) -> int:
        """Rounds this node may still skip: as many as its own pace fits into the time it lost,
        less those it skipped already."""
        pace = self.pace_s()
        if pace is None or self.lost_s <= 0:
            return 0
        return max(0, math.floor(self.lost_s / pace) - self.skipped)

    @property
    def done(self) -> bool:
        return self.round >= self.rounds

    def resume(self, last_round: int, history: Iterable[RoundRecord], lost_s: float = 0.0) -> None:
        """Continue after round `last_round`, from a checkpoint written `lost_s` seconds ago."""
        self.history.extend(history)
        self.completed = self.round = last_round + 1
        self.resumed_from = last_round
        self.lost_s, self.skipped = max(0.0, lost_s), 0


def right_bits(right: Sequence[bool]) -> str:
    """Right or wrong per test image, packed 8 a byte (numpy.packbits order), as hex."""
    return np.packbits(np.asarray(right, dtype=bool)).tobytes().hex() if len(right) else ""


def right_from_bits(bits: str, n: int) -> np.ndarray | None:
    """The inverse of `right_bits` for a test split of `n` images; None if `bits` does not hold them."""
    try:
        unpacked = np.unpackbits(np.frombuffer(bytes.fromhex(bits), dtype=np.uint8))
    except ValueError:
        return None
    return unpacked[:n].astype(bool) if n > 0 and len(unpacked) >= n and len(bits) == 2 * ((n + 7) // 8) else None


def served_because(
    chosen: str, validation: Mapping[str, float], images: int, why: str = "", alone: str = "local"
) -> str:
    """Why a node serves `chosen`, in a few words for `status` and the report: the algorithm's
    reason (`why`: what its peers run, say), then its accuracy on the images the node held out
    (the mean over the rounds it chose on), beside the local-only model's, or beside the best
    collaborative one where it serves the local model."""
    if not validation or images <= 0 or chosen not in validation:
        return f"{chosen} ({why})" if why else chosen
    if chosen == alone:  # beside the best predictor the network gave (not one mixed with the local model)
        others = [name for name in validation if alone not in name]
    else:
        others = [name for name in validation if name == alone]
    other = max(others, key=lambda name: validation[name], default=None)
    beside = "" if other is None else f", {other} {validation[other] * 100:.0f} %"
    return f"{chosen} ({why + '; ' if why else ''}held-out {validation[chosen] * 100:.0f} %{beside}; {images} images)"
