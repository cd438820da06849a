"""One node's learning round, without I/O: the engine the daemon's round driver and the simulator
both drive, so the round exists once.

The engine holds the round's phase and says what comes next (`next_command`), as a libp2p
behaviour returns actions to its swarm; the drivers only carry the commands out:

    BEGIN ─► STEP (the local step) ─► DELIVER ─► PUBLISH (each payload then `published`)
          ─► GATHER: expect, gather; offer (each payload that comes) · deliver · respond, until
             the `Gather` says it is over ─► close_gather
          ─► DELIVER (what is queued by then) ─► END_ROUND ─► RECORD (the driver evaluates; the
             round's `RoundRecord`, built here and only here) ─► NEXT (the round to run next) ─►
             BEGIN … or DONE

A call out of that order raises `RoundOrderError`. DELIVER is `deliver` and then `respond` (the
answers the delivered payloads are owed); during the gather the driver delivers and answers at
each arrival as well. Payloads are offered at any time.

The engine decides what is accepted (`RoundState.offer`), who has arrived, when the gather ends
and what the round's record says; it reads no clock and touches no socket: times come in as
numbers, traffic as the counts the driver keeps (p2pnode/metrics.py's `SentTraffic`, the one
counter of frames sent, in the daemon and in the simulator alike). Its heavy calls (`step`,
`respond`, `end_round`) run wherever the driver puts them: a worker thread in the daemon
(p2pnode/learning/driver.py), in line in the simulator (testnet/simulation/shard.py). What each driver keeps is
its own: the daemon threads, clocks, sockets, checkpoints and the history file; the simulator
routing frames between its nodes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol import Envelope, MessageType, Pass

from .rounds import ADAPTIVE, AdaptiveDeadline, Gather, Progress, RoundRecord, RoundState, Schedule, right_bits

if TYPE_CHECKING:
    from algorithms.interface import Algorithm, Evaluation, LocalReport, Outbound, PayloadRejected

    from ..learning.settings import AlgorithmSettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["Command", "RoundEngine", "RoundOrderError", "Timings", "round_state", "seconds"]

# Digits a record keeps of a duration: a tenth of a millisecond is finer than any round.
SECONDS_DIGITS = 4


def seconds(duration: float) -> float:
    """A duration as records and status show it."""
    return round(duration, SECONDS_DIGITS)


@dataclass(frozen=True)
class Timings:
    """How long one node's round took, as its driver measured it (the engine reads no clock):
    the local step, the wait for the neighbours, the whole round, and when the round ended
    (seconds since the node's learning started; simulated time in the simulator)."""

    step_s: float
    gather_s: float
    round_s: float
    ended_at: float


class Command(enum.Enum):
    """What a driver does next for the round (`RoundEngine.next_command`)."""

    BEGIN = "begin"  # begin(round) the round `RoundEngine.round` names
    STEP = "step"  # step(round): the local step (heavy)
    DELIVER = "deliver"  # deliver(), count what it refused, send what respond() returns
    PUBLISH = "publish"  # send what publish(round) returns, each then published(...)
    GATHER = "gather"  # expect(round), gather(now, ...), then wait, delivering and answering at each arrival, until
    #                    gather_finished; then close_gather()
    END_ROUND = "end_round"  # end_round(round): graph step and aggregation (heavy)
    RECORD = "record"  # evaluate the predictors, then record(...)
    NEXT = "next"  # next_round(peers): the round to run next
    DONE = "done"  # no round left (`RoundEngine.done`)


# One round, in order: what `next_command` answers, one after the other.
ROUND = (
    Command.BEGIN,
    Command.STEP,
    Command.DELIVER,
    Command.PUBLISH,
    Command.GATHER,
    Command.DELIVER,
    Command.END_ROUND,
    Command.RECORD,
    Command.NEXT,
)


class RoundOrderError(RuntimeError):
    """A driver called the engine out of the round's order: a bug in the driver."""


def round_state(settings: AlgorithmSettings, history_rounds: int | None = None) -> RoundState[Envelope]:
    """The `RoundState` `settings` bound (`[algorithm]`: queue sizes, rounds ahead, catch-up);
    `history_rounds` overrides how many records it keeps."""
    return RoundState(
        waits_for=frozenset(),
        rounds=settings.rounds,
        max_rounds_ahead=settings.max_rounds_ahead,
        inbox_frames=settings.inbox_frames,
        peer_inbox_frames=settings.peer_inbox_frames,
        catch_up_quorum=settings.catch_up_quorum,
        history_rounds=settings.history_rounds if history_rounds is None else history_rounds,
    )


class RoundEngine:
    """One node's rounds: its algorithm (once `attach`ed) and its `RoundState`. Payloads are
    queued as the protocol's `Envelope`s, the daemon's verified ones or the simulator's decoded
    ones, so the engine hands the algorithm the same body and frame in both.

    Its `Schedule` says how long a gather lasts: sync, until the round's payloads are in (a fixed
    or an adaptive deadline); async, `async_gather_s` at most, the algorithm then mixing the
    latest payload of each neighbour weighted by its age (`Staleness`, set on it at `attach`)."""

    def __init__(self, state: RoundState[Envelope], schedule: Schedule | None = None) -> None:
        self.state = state
        self.schedule = Schedule() if schedule is None else schedule
        state.asynchronous = self.schedule.asynchronous
        self.deadlines = AdaptiveDeadline(
            self.schedule.deadline_window, self.schedule.deadline_mads, self.schedule.deadline_min_s
        )
        self.progress = Progress()  # the peers' rounds as their payloads come: does one still run?
        self._gather: Gather | None = None  # the round's gather, once open
        self.algorithm: Algorithm | None = None
        self._report: LocalReport | None = None  # the local step of the round in progress
        self._sent_to: set[str] = set()  # peers sent anything in the round in progress
        # Peers the last round's publish went to: one dropped from this round's is sent a PASS.
        self._published_to: frozenset[str] = frozenset()
        self._passed: frozenset[str] = frozenset()  # the expected peers that sent PASS instead
        self._expected: frozenset[str] = frozenset()
        self._came: frozenset[str] = frozenset()  # the expected peers that arrived, once the gather closed
        self._at = 0  # where in ROUND the node is: what `next_command` answers
        self._begun = False  # a round was begun on this engine
        self._finished = False  # `next_round` found no round left

    def attach(self, algorithm: Algorithm) -> None:
        """Learn with `algorithm` from now on; what was queued before it of a type it does not
        take is refused when due."""
        self.algorithm = algorithm
        self.state.waits_for = algorithm.waits_for
        self.state.takes = frozenset(algorithm.sends)  # and PASS, which the engine itself takes
        if self.schedule.asynchronous:
            from algorithms.interface import Staleness

            algorithm.set_staleness(Staleness(self.schedule.staleness_decay, self.schedule.max_staleness))

    @property
    def round(self) -> int:
        return self.state.round

    @property
    def sends(self) -> frozenset[MessageType]:
        """The payload types this node may publish: its algorithm's, and the engine's own PASS."""
        return frozenset(self.algorithm.sends) | {MessageType.PASS}

    # --- the round, in order -------------------------------------------------------------------

    def next_command(self) -> Command:
        """What the driver does next for the round (`Command`); DONE once no round is left, and
        from the start where the state, resumed, has run every round."""
        if self._finished or (not self._begun and self.state.done):
            return Command.DONE
        return ROUND[self._at]

    def _advance(self, command: Command) -> None:
        """`command` is being carried out: the round moves past it; out of order, it raises."""
        self._within(command, call=command.value)
        self._at = (self._at + 1) % len(ROUND)

    def _within(self, *commands: Command, call: str) -> None:
        """`call` belongs to one of `commands`; out of order, it raises."""
        if (now := self.next_command()) not in commands:
            raise RoundOrderError(f"{call} called in round {self.state.round} while the round waits for {now.value}")

    def begin(self, round: int) -> None:
        """Start round `round` (the one `RoundState.next_round` chose)."""
        self._advance(Command.BEGIN)
        self._begun = True
        self.state.round = round
        self._report, self._sent_to = None, set()
        self._expected = self._came = self._passed = frozenset()
        self._gather = None

    def step(self, round: int) -> LocalReport:
        """The local step (heavy: the daemon runs it in a worker thread)."""
        self._advance(Command.STEP)
        self._report = self.algorithm.local_step(round)
        return self._report

    def publish(self, round: int) -> list[Outbound]:
        """The algorithm's payloads of `round`, and a PASS to each peer it published to last
        round and not in this one: that peer's gather, which expects us, closes at once instead
        of at its deadline."""
        from algorithms.interface import Outbound

        self._advance(Command.PUBLISH)
        out = list(self.algorithm.publish(round))
        to = frozenset(peer for each in out for peer in each.to)
        dropped, self._published_to = self._published_to - to, to
        return [*out, Outbound(to=tuple(sorted(dropped)), body=Pass())] if dropped else out

    @staticmethod
    def tag(out: Outbound, round: int) -> int:
        """The round a payload is tagged with: its own (an answer names the round it answers), or
        the round in progress."""
        return round if out.round is None else out.round

    def published(self, round: int, out: Outbound, to: tuple[str, ...] | list[str], seq: int) -> None:
        """`out`, tagged `round`, went to `to` (the addressees the driver could reach) as sequence
        number `seq`."""
        if not isinstance(out.body, Pass):  # the engine's own, not the algorithm's
            self.algorithm.published(round, out, seq)
        self._sent_to.update(to)

    def expect(self, round: int) -> frozenset[str]:
        """The peers whose payloads of `round` the gather waits for."""
        self._within(Command.GATHER, call="expect")
        self._expected = frozenset(self.algorithm.expected(round))
        return self._expected

    # --- the gather ----------------------------------------------------------------------------

    def offer(self, peer: str, round: int, envelope: Envelope) -> str | None:
        """A payload from `peer` for `round`: queued, or the reason it was refused."""
        return self.state.offer(peer, round, envelope.type, envelope)

    def deliver(self) -> list[tuple[Envelope, PayloadRejected]]:
        """Hand the algorithm the queued payloads of this round or earlier, in arrival order;
        returns those it refused, with its refusal (the driver counts them by its reason)."""
        from algorithms.interface import Frame, PayloadRejected

        self._within(Command.DELIVER, Command.GATHER, call="deliver")
        refused = []
        for peer, round, envelope in self.state.due():
            try:
                self.algorithm.receive(peer, round, envelope.body, Frame(envelope.seq, envelope.sender))
            except PayloadRejected as rejected:
                refused.append((envelope, rejected))
            else:
                self.progress.observe(peer, round, self.state.round)
        return refused

    def respond(self) -> list[Outbound]:
        """The answers the delivered payloads are owed (heavy: scoring a model runs it); after a
        DELIVER's `deliver`, the round moves on."""
        self._within(Command.DELIVER, Command.GATHER, call="respond")
        answers = list(self.algorithm.respond())
        if self.next_command() is Command.DELIVER:
            self._advance(Command.DELIVER)
        return answers

    def gather(
        self, now: float, *, quorum: float, deadline_s: float, grace_s: float, hold_until: float = -math.inf
    ) -> Gather:
        """Start waiting, at `now`, for the expected peers (`RoundState.gather`) as the schedule
        says: `deadline_s` is the fixed deadline (`round_deadline_s`); async, the gather lasts
        `async_gather_s` at most; an adaptive deadline follows the peers' arrival delays within it."""
        self._within(Command.GATHER, call="gather")
        if self.schedule.asynchronous:
            deadline_s = min(deadline_s, self.schedule.async_gather_s)
        elif self.schedule.deadline == ADAPTIVE:
            deadline_s = self.deadlines.deadline_s(self._expected, deadline_s)
        self._gather = self.state.gather(
            self._expected, now, quorum=quorum, deadline_s=deadline_s, grace_s=grace_s, hold_until=hold_until
        )
        return self._gather

    def gather_finished(self, gather: Gather, now: float) -> bool:
        return gather.finished(self.state.settled(self.state.round), now)

    def close_gather(self) -> frozenset[str]:
        """The gather is over: the expected peers that sent everything in time (async: or sent a
        later round, whose payload stands in, fresh). Each expected peer's delay is noted for an
        adaptive deadline; one that did not come, as the whole wait (it came later, if at all)."""
        self._advance(Command.GATHER)
        came = self.state.settled if self.schedule.asynchronous else self.state.arrived
        self._came = self._expected & came(self.state.round)
        self._passed = self._expected & (self.state.passed(self.state.round) - self._came)
        if self._gather is not None:
            for peer in sorted(self._expected):
                self.deadlines.observe(peer, self._gather.arrived_after.get(peer, self._gather.looked))
        return self._came

    def end_round(self, round: int) -> None:
        """Graph step and aggregation (heavy)."""
        self._advance(Command.END_ROUND)
        self.algorithm.end_round(round)

    def next_round(self, peers: Collection[str]) -> int:
        """The round to run next (`RoundState.next_round`), which the rounds of the peers this
        node gives weight may pull along; while it weighs none (it just started, or learns from
        nobody), those of all its learning `peers`; never its own."""
        self._advance(Command.NEXT)
        weighted = {peer for peer, weight in self.algorithm.weights().items() if weight > 0}
        round = self.state.next_round((weighted - {self.algorithm.node_id}) or set(peers))
        self._finished = self.done()
        return round

    def done(self) -> bool:
        """No round left to run (call after `next_round`): `rounds` are run and, async, no
        overtime either. Async, a node goes on past `rounds`, `overtime_rounds` more at most,
        while a neighbour it gives weight still runs and sends to it (`Progress.running`), has not
        sent its last round yet, and its latest payload is within `max_staleness` rounds: a fast
        node keeps learning from the neighbours that still run instead of ending on their old
        payloads. One that fell that far behind holds nobody, nor one that fell silent: a fast
        neighbour that finished, or stopped sending to this node, left its latest round behind
        this node's but runs no longer."""
        state, schedule = self.state, self.schedule
        if not state.done:
            return False
        if not schedule.asynchronous or state.round >= state.rounds + schedule.overtime_rounds:
            return True
        algorithm, last = self.algorithm, state.rounds - 1
        latest = algorithm.latest_rounds()
        weighed = [peer for peer, weight in algorithm.weights().items() if weight > 0 and peer != algorithm.node_id]
        return not any(
            state.round - schedule.max_staleness <= latest.get(peer, -1) < last
            and self.progress.running(peer, state.round)
            for peer in weighed
        )

    # --- the record ----------------------------------------------------------------------------

    def record(
        self,
        evaluation: Evaluation,
        timings: Timings,
        sent: Mapping[str, tuple[int, int, int]],
        discovery_sent: Mapping[str, tuple[int, int, int]] | None = None,
        local_baseline: Mapping[str, float] | None = None,
    ) -> RoundRecord:
        """The round's record, from the driver's evaluation, timings and traffic so far (learning
        frames by type; discovery frames too where there is a network); the round is then done."""
        self._advance(Command.RECORD)
        algorithm, round = self.algorithm, self.state.round
        record = RoundRecord(
            node=algorithm.node_id,
            round=round,
            accuracy=evaluation.accuracy,
            own_class_accuracy=evaluation.own_class_accuracy,
            loss=self._report.loss,
            test_loss=evaluation.loss,
            weights=algorithm.weights(),
            expected=len(self._expected),
            arrived=len(self._came),
            missing=tuple(sorted(self._expected - self._came - self._passed)),
            recipients=len(self._sent_to),
            sent={str(kind): counts for kind, counts in sent.items()},
            step_s=seconds(timings.step_s),
            gather_s=seconds(timings.gather_s),
            round_s=seconds(timings.round_s),
            accuracy_by_predictor=evaluation.by_predictor,
            predictor=evaluation.predictor,
            test_samples=evaluation.total,
            test_right=right_bits(evaluation.right),
            validation_by_predictor=evaluation.validation,
            validation_samples=evaluation.validation_total,
            predictor_why=evaluation.why,
            discovery_sent={str(kind): counts for kind, counts in (discovery_sent or {}).items()},
            local_baseline=dict(local_baseline or {}),
            ended_at=seconds(timings.ended_at),
        )
        self.state.finish(record)
        return record
