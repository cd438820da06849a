"""The round driver: runs a learning algorithm (algorithms/interface.py) over the node's network.

    per round r:  local step (worker thread) ─► publish to the algorithm's addressees
                  ─► gather: wait for the expected neighbours' round-r payloads (each type the
                     algorithm waits for), until a quorum of them or the round deadline,
                     answering what arrives meanwhile (SCooL's scores; worker thread)
                  ─► graph step + aggregation (worker thread)
                  ─► evaluate ─► record ─► checkpoint (atomic) ─► r + 1, or catch up

Every decision (what to publish and queue, who has arrived, when the gather ends, which round is
next, what the round's record says) is made by the I/O-free round engine (engine.py, over
rounds.py's `RoundState`), the one the simulator drives too; this module only moves payloads,
keeps time, checkpoints, and runs the engine's heavy calls in a worker thread, one at a time, so
algorithm state is never touched by two threads at once. It talks to the node through the
narrow `Network` handles and imports nothing of node.py; the node builds the algorithm it runs
(algorithm.py). docs/architecture.md shows where it sits.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from protocol import Body, Envelope, MessageType

from ..discovery.capabilities import learning_capability
from ..files import describe_os_error
from ..memory import trim_now
from .algorithm import LearningSetupError, build_local_baseline
from .checkpoint import Checkpoint, CheckpointError, HeldOut
from .engine import Command, RoundEngine, Timings, round_state, seconds
from .history import HistoryFile
from .rounds import ROUND_AHEAD, RoundRecord, Schedule, right_bits

if TYPE_CHECKING:
    from algorithms.interface import Algorithm, Evaluation, Outbound
    from algorithms.models.inference import EvaluatedModel

    from ..learning.settings import AlgorithmSettings

__all__ = ["Network", "RoundDriver", "ALONE_ROUNDS", "CHECKPOINT_LOG_EVERY"]

log = logging.getLogger("p2pnode.learning")

# A saved checkpoint is logged at INFO every this many rounds and at the last, at DEBUG otherwise:
# one line per round was most of a long run's log.
CHECKPOINT_LOG_EVERY = 10

EXCLUDED_NAMED = 3  # peers left out of learning that the "no learning peers" warning names


def _left_out(excluded: Mapping[str, str]) -> str:
    """The admitted peers that do not learn with this node, and why (the warning's reader looks
    here first: a class list or algorithm that differs, said seconds before in another line)."""
    if not excluded:
        return ""
    named = "; ".join(f"{peer} {why}" for peer, why in list(excluded.items())[:EXCLUDED_NAMED])
    more = f"; and {len(excluded) - EXCLUDED_NAMED} more" if len(excluded) > EXCLUDED_NAMED else ""
    return f"; admitted but left out: {named}{more}"


# A node that communicates but has had no learning peer for this many rounds in a row says so
# in its log, once per such streak: it is training alone, which is rarely what was meant.
ALONE_ROUNDS = 3


@dataclass(frozen=True)
class Network:
    """What the round driver may do with the node: narrow handles, nothing else."""

    peers: Callable[[], Mapping[str, str]]  # learning peers (ready, same algorithm): node id → address
    send: Callable[[tuple[str, ...], Body, int], Awaitable[int | None]]  # to addresses, tagged round → seq
    rejected: Callable[[str, int], None]  # count a refused payload: reason, frame size
    sent: Callable[[], Mapping[MessageType, tuple[int, int, int]]]  # learning frames sent so far, by type
    discovery_sent: Callable[[], Mapping[MessageType, tuple[int, int, int]]]  # discovery frames so far, by type
    excluded: Callable[[], Mapping[str, str]] = dict  # ready peers that are not learning peers: node id → why


@dataclass
class _RoundTimes:
    """When the round in progress began, its local step ended, its gather closed (the trio
    clock), and when its end began (the clock and CPU seconds: `paced`)."""

    started: float
    stepped: float = 0.0
    gathered: float = 0.0
    ending: Began | None = None


@dataclass(frozen=True)
class Began:
    """When a computation of the round began: on the trio clock and in CPU seconds of this process."""

    at: float
    cpu_s: float

    @classmethod
    def now(cls) -> Began:
        return cls(trio.current_time(), time.process_time())


async def paced(slowdown: float, began: Began) -> None:
    """Emulate a device `slowdown` times slower than one core of this machine (`[node].slowdown`
    > 1: testnets' `--slow` and `--pace`): after a computation of the round (the local step; the
    end of round: graph step and evaluation), sleep until `slowdown` × the CPU seconds this
    process spent on it have passed since it began. CPU seconds, not wall seconds: daemons that
    share the machine's cores stretch each other's wall time, not their CPU time, so the emulated
    speed holds while the paced daemons leave the cores room (the sleep hands them to the others)
    and a computation that already took longer is not stretched again. 1: no pacing."""
    if slowdown > 1:
        await trio.sleep_until(began.at + slowdown * (time.process_time() - began.cpu_s))


def _age_s(path: Path) -> float:
    """How long ago `path` (the checkpoint) was written, by the wall clock (the monotonic one
    starts again with the process): the time this node was down, and the one ground on which it
    may skip the rounds its peers ran meanwhile (`RoundState.next_round`)."""
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return 0.0


class RoundDriver:
    """Created when the node starts, so payloads of peers that are ahead are queued while this
    node still loads its data and model."""

    def __init__(
        self,
        settings: AlgorithmSettings,
        network: Network,
        checkpoint_path: Path | None,
        history_path: Path | None = None,
        slowdown: float = 1.0,
    ) -> None:
        """`slowdown`: `[node].slowdown`, the emulated device speed (`paced`)."""
        self.settings = settings
        self.slowdown = slowdown
        self.network = network
        self.checkpoint_path = checkpoint_path if settings.checkpoint else None
        # Each finished round's record, appended for `p2pnode report` (history.py)
        self.history = None if history_path is None else HistoryFile(history_path, settings.history_max_bytes)
        self.algorithm: Algorithm | None = None
        self.local_baseline: Algorithm | None = None  # `[algorithm].local_baseline`'s model
        self.local_baseline_since = 0  # the first round it trained (later if switched on mid-run)
        self.phase = "starting"
        self.engine = RoundEngine(round_state(settings), Schedule.of(settings))
        self.state = self.engine.state
        self._arrival = trio.Event()
        self._limiter = trio.CapacityLimiter(1)  # one algorithm call at a time
        self.checkpoint_round: int | None = None  # the round of the checkpoint on disk
        self.checkpoint_failures = 0  # saves that failed (a full disk): the older checkpoint stays
        self.checkpoint_error: str | None = None  # why the last save failed; None once one succeeds
        # What the last evaluation scored (algorithms/models/inference.py): `predict` answers with it
        # while training goes on; and its prediction for each held-out image.
        self.evaluated: EvaluatedModel | None = None
        self.held_out: HeldOut | None = None
        self._last_payload: dict[str, tuple[float, int]] = {}  # peer → (when, round) of its latest payload
        self._alone_since, self._alone_rounds = 0, 0  # the current streak of rounds without a learning peer
        # Until then the first round waits for its peers, whatever the round deadline: a peer
        # admitted at start-up may still be loading its data and model, and a node that went
        # ahead alone would find nobody to wait for in the rounds after.
        self._start_deadline = -math.inf
        self._learning_started: float | None = None  # its first round's start: records' `ended_at` count from it
        self._times = _RoundTimes(0.0)  # the round in progress's

    @property
    def round(self) -> int:
        return self.state.round

    # --- the network side ----------------------------------------------------------------

    def on_payload(self, envelope: Envelope) -> None:
        """Called by the node for every verified learning payload from an admitted peer."""
        refusal = self.engine.offer(envelope.sender_id, envelope.round, envelope)
        if refusal is not None:
            self.network.rejected(refusal, envelope.size)
            if refusal == ROUND_AHEAD:  # refused, but it says how far its sender has got: that
                self._arrival.set()  # sender is settled, so a gather waiting for it is over
        else:
            self._last_payload[envelope.sender_id] = (trio.current_time(), envelope.round)
            self._arrival.set()

    async def _deliver_and_answer(self) -> None:
        """Hand over the queued payloads of this round or earlier (never during a worker-thread
        call), then send the answers they are owed (computed in a worker thread: scoring a
        model runs it on a batch)."""
        for envelope, rejected in self.engine.deliver():
            self.network.rejected(rejected.reason, envelope.size)
            log.debug("payload from %s rejected: %s", envelope.sender_id, rejected)
        for out in await self._in_thread(self.engine.respond):
            await self._send(out)

    async def _send(self, out: Outbound) -> None:
        """To those of its addressees that are learning peers now."""
        peers, tag = self.network.peers(), self.engine.tag(out, self.engine.round)
        to = [node for node in out.to if node in peers]
        seq = await self.network.send(tuple(peers[node] for node in to), out.body, tag)
        if seq is not None:
            self.engine.published(tag, out, to, seq)

    async def _in_thread(self, function: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(function, *args, limiter=self._limiter)

    # --- the rounds ----------------------------------------------------------------------

    async def run(self, build: Callable[[], Algorithm]) -> None:
        """Build the algorithm (in a worker thread, while discovery runs), resume from the
        checkpoint, then drive the rounds. Raises LearningSetupError if learning cannot start;
        a failure in a round (a diverging loss, say) stops learning only, and `phase` says why."""
        try:
            self.algorithm = await self._in_thread(build)
        except LearningSetupError:
            raise
        except Exception as exc:  # a dataset root or model problem: the node cannot do its job
            raise LearningSetupError(f"[data]/[model]/[algorithm]: cannot set up learning: {exc}") from exc
        if self.settings.local_baseline:
            self.local_baseline = await self._in_thread(build_local_baseline, self.algorithm, self.settings.settings)
        self.engine.attach(self.algorithm)  # what was queued before, of a type it does not take: refused when due
        from algorithms.models.inference import EvaluatedModel

        self.evaluated = EvaluatedModel()
        self._resume()
        await self._history_start()
        try:
            if self.engine.next_command() is not Command.DONE:  # a finished run restarted waits for nobody
                await self._wait_for_peers()
            # The engine says what comes next (engine.py: the round, in order); this carries it out.
            carry_out: dict[Command, Callable[[int], Awaitable[None]]] = {
                Command.BEGIN: self._begin,
                Command.STEP: self._step,
                Command.DELIVER: self._deliver,
                Command.PUBLISH: self._publish,
                Command.GATHER: self._gather,
                Command.END_ROUND: self._end_round,
                Command.RECORD: self._record,
                Command.NEXT: self._next,
            }
            while (command := self.engine.next_command()) is not Command.DONE:
                await carry_out[command](self.engine.round)
        except Exception as exc:
            self.phase = f"failed: {type(exc).__name__}: {exc}"
            log.exception("learning stopped in round %d", self.state.round)
            return
        self.phase = "done"
        log.info("all %d rounds done", self.state.completed)

    async def _wait_for_peers(self) -> None:
        self.phase = "waiting for peers"
        self._start_deadline = trio.current_time() + self.settings.start_timeout_s
        with trio.move_on_at(self._start_deadline):
            while len(self.network.peers()) < self.settings.start_peers:
                await trio.sleep(0.05)

    async def _begin(self, round: int) -> None:
        self._times = _RoundTimes(trio.current_time())
        if self._learning_started is None:
            self._learning_started = self._times.started
        self.engine.begin(round)

    async def _deliver(self, round: int) -> None:
        """Tell the algorithm who its peers are now, then deliver and answer."""
        peers = self.network.peers()
        self.algorithm.set_peers(peers)
        self._last_payload = {peer: seen for peer, seen in self._last_payload.items() if peer in peers}  # bounded
        await self._deliver_and_answer()

    async def _publish(self, round: int) -> None:
        self._note_peers(round)
        self.phase = "publish"
        for out in self.engine.publish(round):
            await self._send(out)

    async def _end_round(self, round: int) -> None:
        self.phase = "aggregate"
        self._times.ending = Began.now()
        await self._in_thread(self.engine.end_round, round)

    async def _record(self, round: int) -> None:
        """Evaluate (and the local baseline's round), record, append to the history, checkpoint."""
        engine, times = self.engine, self._times
        evaluation = await self._in_thread(self._evaluate, round)
        self.held_out = HeldOut(evaluation.predicted, tuple(self.algorithm.setup.data.test_labels.tolist()))
        baseline = {} if self.local_baseline is None else await self._in_thread(self._local_baseline_round, round)
        await paced(self.slowdown, times.ending)
        now = trio.current_time()
        timings = Timings(
            times.stepped - times.started,
            times.gathered - times.stepped,
            now - times.started,
            now - self._learning_started,
        )
        record = engine.record(evaluation, timings, self.network.sent(), self.network.discovery_sent(), baseline)
        if self.history is not None:  # before the checkpoint: no checkpoint covers a round not on disk
            await trio.to_thread.run_sync(self.history.append, record)
        await self._save_checkpoint(record)
        trim_now()  # the round's activations and gradients are free: give their pages back until the next
        log.info(
            "round %d: accuracy %.3f, %d/%d expected payloads (%d missing), %.2f s",
            round,
            record.accuracy,
            record.arrived,
            record.expected,
            len(record.missing),
            trio.current_time() - times.started,
            extra={"round": round, "accuracy": record.accuracy, "arrived": record.arrived, "expected": record.expected},
        )

    async def _next(self, round: int) -> None:
        self.engine.next_round(self.network.peers())  # its rounds, and async its overtime (RoundEngine.done)

    async def _step(self, round: int) -> None:
        """The local step, in the worker thread. Payloads that come meanwhile are queued."""
        self.phase = "local step"
        began = Began.now()
        await self._in_thread(self.engine.step, round)
        await paced(self.slowdown, began)
        self._times.stepped = trio.current_time()

    def _local_baseline_round(self, round: int) -> dict[str, float | str]:
        """The local baseline's step and evaluation in `round` (in the worker thread)."""
        report = self.local_baseline.local_step(round)
        evaluation = self.local_baseline.evaluate()
        return {
            "accuracy": evaluation.accuracy,
            "own_class_accuracy": evaluation.own_class_accuracy,
            "loss": report.loss,
            "test_loss": evaluation.loss,
            "since": self.local_baseline_since,
            "test_right": right_bits(evaluation.right),  # image by image, for a small fleet's interval
        }

    async def _history_start(self) -> None:
        """The history's start line: what the node runs, and from which round it goes on."""
        if self.history is None:
            return
        setup = self.algorithm.setup
        details = {
            "node": self.algorithm.node_id,
            "algorithm": self.algorithm.name,
            "backbone": setup.backbone,
            "classes": list(setup.data.own_classes),
            "test_samples": len(setup.data.test_labels),
            "device": str(setup.device),
            "local_baseline": self.local_baseline is not None,
            "resumed_from": self.state.resumed_from,
        }
        await trio.to_thread.run_sync(self.history.start, details)

    def _evaluate(self, round: int) -> Evaluation:
        """Evaluate, and keep what was scored (worker thread)."""
        evaluation = self.algorithm.evaluate()
        self.evaluated.keep(self.algorithm.predictors(), round)
        return evaluation

    def _note_peers(self, round: int) -> None:
        """Log once when a node that communicates has had no learning peer for ALONE_ROUNDS
        rounds, and once when it has some again."""
        if not self.algorithm.sends:
            return  # it never communicates (local, scool-local): alone is what it is for
        peers = self.network.peers()
        if not peers:
            if not self._alone_rounds:
                self._alone_since = round
            self._alone_rounds += 1
            if self._alone_rounds == ALONE_ROUNDS:
                log.warning(
                    "no learning peers for %d rounds (since round %d): training alone; a learning peer is an "
                    "admitted peer that announces %s (check [discovery].bootstrap and the peers' [algorithm].name)%s",
                    ALONE_ROUNDS,
                    self._alone_since,
                    learning_capability(self.algorithm.name),
                    _left_out(self.network.excluded()),
                    extra={"round": round, "alone_rounds": ALONE_ROUNDS},
                )
            return
        if self._alone_rounds >= ALONE_ROUNDS:
            log.info(
                "learning peers again in round %d, after %d rounds alone: %d", round, self._alone_rounds, len(peers)
            )
        self._alone_rounds = 0

    async def _gather(self, round: int) -> None:
        """Wait for the expected payloads of the round as the engine's `Gather` decides,
        answering what arrives meanwhile; then close it."""
        self.phase = "gather"
        settings = self.settings
        self.engine.expect(round)
        gather = self.engine.gather(
            trio.current_time(),
            quorum=settings.quorum,
            deadline_s=settings.round_deadline_s,
            grace_s=settings.straggler_grace_s,
            hold_until=self._start_deadline,
        )
        self._start_deadline = -math.inf  # only the first round this node runs
        while not self.engine.gather_finished(gather, trio.current_time()):
            self._arrival = trio.Event()
            with trio.move_on_at(gather.wake_at()) as waiting:
                await self._arrival.wait()
            if not waiting.cancelled_caught:
                await self._deliver_and_answer()
        self._times.gathered = trio.current_time()
        self.engine.close_gather()

    # --- checkpoints ---------------------------------------------------------------------

    async def _save_checkpoint(self, record: RoundRecord) -> None:
        if self.checkpoint_path is None:
            return
        self.phase = "checkpoint"
        baseline = self.local_baseline
        checkpoint = Checkpoint(
            self.algorithm.name,
            record.round,
            self.algorithm.state_dict(),
            tuple(self.state.history),
            None if baseline is None else {"since": self.local_baseline_since, "state": baseline.state_dict()},
            self.held_out,
        )
        try:
            size = await self._in_thread(checkpoint.save, self.checkpoint_path)
        except OSError as exc:
            # Written atomically: the previous checkpoint is intact, and a restart resumes from
            # it. Learning goes on; the next round's save tries again.
            self.checkpoint_failures += 1
            self.checkpoint_error = f"round {record.round}: {describe_os_error(exc)}"
            kept = self.checkpoint_round
            on_disk = "none is on disk yet" if kept is None else f"the one of round {kept} on disk stays valid"
            log.error(
                "[node].data_dir: checkpoint of round %d not saved to %s: %s; %s, learning goes on "
                "and the next round tries again",
                record.round,
                self.checkpoint_path,
                describe_os_error(exc),
                on_disk,
            )
            return
        self.checkpoint_round = record.round
        self.checkpoint_error = None
        last = record.round == self.settings.rounds - 1
        log.log(
            logging.INFO if last or record.round % CHECKPOINT_LOG_EVERY == 0 else logging.DEBUG,
            "checkpoint of round %d written to %s (%d bytes)",
            record.round,
            self.checkpoint_path,
            size,
            extra={"round": record.round, "bytes": size},
        )

    def _resume(self) -> None:
        """Continue from the checkpoint, if there is one."""
        if self.checkpoint_path is None or not self.checkpoint_path.exists():
            return
        try:
            saved = Checkpoint.load(self.checkpoint_path, self.algorithm.name)
            self.algorithm.load_state_dict(saved.state)
            self._resume_local_baseline(saved)
        except CheckpointError as exc:
            raise LearningSetupError(f"[node].data_dir: {exc}") from None
        except (KeyError, ValueError) as exc:
            raise LearningSetupError(f"[node].data_dir: {self.checkpoint_path}: {exc}") from None
        self.state.resume(saved.round, saved.history, lost_s=_age_s(self.checkpoint_path))
        self.checkpoint_round = saved.round
        self.evaluated.keep(self.algorithm.predictors(), saved.round)
        self.held_out = saved.held_out
        log.info("resumed from the checkpoint of round %d", saved.round)

    def _resume_local_baseline(self, saved: Checkpoint) -> None:
        if self.local_baseline is None:
            return
        if saved.local_baseline is None:  # switched on since that checkpoint was written
            self.local_baseline_since = saved.round + 1
            log.warning(
                "[algorithm].local_baseline: the checkpoint of round %d has none; it trains from round %d on, "
                "%d rounds fewer than the collaborative model, and the report says so",
                saved.round,
                saved.round + 1,
                saved.round + 1,
            )
            return
        self.local_baseline.load_state_dict(saved.local_baseline["state"])
        self.local_baseline_since = int(saved.local_baseline["since"])

    def status(self) -> dict[str, Any]:
        state = self.state
        now = trio.current_time()
        last = state.history[-1] if state.history else None
        setup = None if self.algorithm is None else self.algorithm.setup
        return {
            "algorithm": None if self.algorithm is None else self.algorithm.name,
            "device": None if setup is None else str(setup.device),
            "mixed_precision": None if setup is None else setup.mixed_precision,
            "phase": self.phase,
            "round": state.round,
            "rounds": self.settings.rounds,
            "completed": state.completed,
            "resumed_from": state.resumed_from,
            "catch_ups": state.catch_ups,
            "skipped": state.skipped,  # rounds the catch-ups skipped, within the time it was down
            "superseded": state.superseded,
            "accuracy": None if last is None else last.accuracy,
            "neighbours": {} if last is None else {k: v for k, v in last.weights.items() if v > 0},
            "last_payloads": {
                peer: {"round": tagged, "age_s": seconds(now - at)}
                for peer, (at, tagged) in sorted(self._last_payload.items())
            },
            "missing_payloads": dict(sorted(state.missing.items())),
            "inbox": state.queued,
            "checkpoint_round": self.checkpoint_round,
            "checkpoint_failures": self.checkpoint_failures,
            "checkpoint_error": self.checkpoint_error,
            **({} if self.history is None else self.history.status()),
            "history": [record.to_dict() for record in state.history],
        }
