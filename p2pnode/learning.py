"""The round driver: runs a learning algorithm (algorithms/seam.py) over the node's network.

    per round r:  local step (worker thread) ─► publish to the algorithm's addressees
                  ─► gather: wait for the expected neighbours' round-r payloads (each type the
                     algorithm waits for), until a quorum of them or the round deadline,
                     answering what arrives meanwhile (SCooL's scores; worker thread)
                  ─► graph step + aggregation (worker thread)
                  ─► evaluate ─► checkpoint (atomic) ─► r + 1, or catch up with the network

Nodes are not in lock-step. Payloads are queued as they arrive (bounded) and handed to the
algorithm only between its worker-thread calls, so algorithm state is never touched by two
threads at once. Payloads for later rounds wait in the queue (up to `max_rounds_ahead`); a node
that sees most peers further ahead than that jumps forward instead of replaying old rounds.
All algorithm logic stays in algorithms/: this module only moves payloads and keeps time.
"""

from __future__ import annotations

import io
import logging
import math
import statistics
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from protocol import Body, Envelope, MessageType

from .files import write_atomically

if TYPE_CHECKING:
    from algorithms.seam import Algorithm

    from .node import Node

__all__ = ["RoundDriver", "build_algorithm", "CHECKPOINT_NAME", "CheckpointError"]

log = logging.getLogger("p2pnode.learning")

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 1
ROUND_AHEAD = "round_ahead"  # a payload too far ahead of this node's round
INBOX_FULL = "inbox_full"  # the bounded payload queue was full


class CheckpointError(Exception):
    """A checkpoint exists but cannot be used; the message says why (the node does not start)."""


def build_algorithm(config, node_id: str) -> Algorithm:
    """The node's algorithm, its shard of the configured scenario and its model (slow: loads
    data and builds the model; run it in a worker thread)."""
    import torch

    from algorithms.datasets import load_dataset
    from algorithms.partitions import PartitionSpec, make_partition
    from algorithms.registry import apply_overrides, default_config, make_algorithm
    from algorithms.setup import class_list_setup, node_setup

    data, model, algorithm = config.data, config.model, config.algorithm
    if model.threads:
        torch.set_num_threads(model.threads)
    dataset = load_dataset(data.dataset, None if data.root is None else str(data.root))
    if data.classes:
        setup = class_list_setup(
            node_id,
            dataset,
            data.classes,
            data.node_index,
            backbone=model.backbone,
            seed=data.seed,
            samples_per_class=data.samples_per_class,
            test_per_class=data.test_per_class,
        )
    else:
        partition = make_partition(
            dataset,
            PartitionSpec(
                scenario=data.scenario,
                nodes=data.nodes,
                clusters=data.clusters or None,
                samples_per_class=data.samples_per_class,
                test_per_class=data.test_per_class,
                seed=data.seed,
            ),
        )
        setup = node_setup(node_id, dataset, partition, data.node_index, backbone=model.backbone, seed=data.seed)
    return make_algorithm(
        algorithm.name, setup, apply_overrides(default_config(algorithm.name), dict(algorithm.settings))
    )


class RoundDriver:
    """Created when the node starts, so payloads of peers that are ahead are queued while this
    node still loads its data and model; `attach` hands it the algorithm once that is built."""

    def __init__(self, node: Node, checkpoint_path: Path | None) -> None:
        self.node = node
        self.algorithm: Algorithm | None = None
        self.settings = node.config.algorithm
        self.checkpoint_path = checkpoint_path
        self.round = 0  # the round in progress (or next, between rounds)
        self.completed = -1  # the last round finished
        self.phase = "starting"
        self.history: deque[dict[str, Any]] = deque(maxlen=self.settings.history_rounds)
        self.resumed_from: int | None = None
        self.catch_ups = 0
        # (round, peer id, body, (seq, sender key), frame size)
        self._inbox: list[tuple[int, str, Body, tuple[int, bytes], int]] = []
        self._heard: dict[int, dict[str, set[MessageType]]] = {}  # round → peer → payload types that arrived
        self._peer_round: dict[str, int] = {}  # latest round each peer sent a payload for
        self._heard_this_round: set[str] = set()  # peers heard from since the last round ended
        self._arrival = trio.Event()
        self._limiter = trio.CapacityLimiter(1)  # one algorithm call at a time

    def attach(self, algorithm: Algorithm) -> None:
        self.algorithm = algorithm

    # --- the network side ----------------------------------------------------------------

    async def on_payload(self, envelope: Envelope) -> None:
        """Called by the node for every verified learning payload from an admitted peer."""
        peer, round = envelope.sender_id, envelope.round
        self._peer_round[peer] = max(round, self._peer_round.get(peer, -1))
        self._heard_this_round.add(peer)
        if round > self.round + self.settings.max_rounds_ahead:
            self.node.metrics.rejected(ROUND_AHEAD, envelope.size)
            return
        if len(self._inbox) >= self.settings.inbox_frames:
            self.node.metrics.rejected(INBOX_FULL, envelope.size)
            return
        self._inbox.append((round, peer, envelope.body, (envelope.seq, envelope.sender), envelope.size))
        self._heard.setdefault(round, {}).setdefault(peer, set()).add(envelope.type)
        self._arrival.set()

    def _arrived(self, round: int) -> set[str]:
        """Peers that sent every payload type the algorithm waits for, for `round`."""
        wanted = self.algorithm.waits_for
        return {peer for peer, kinds in self._heard.get(round, {}).items() if kinds >= wanted}

    def _deliver(self) -> None:
        """Hand queued payloads of this round or earlier to the algorithm (never during a
        worker-thread call); later ones stay queued."""
        from algorithms.seam import Frame, PayloadRejected

        later = []
        for round, peer, body, frame, size in self._inbox:
            if round > self.round:
                later.append((round, peer, body, frame, size))
                continue
            try:
                self.algorithm.receive(peer, round, body, Frame(*frame))
            except PayloadRejected as rejected:
                self.node.metrics.rejected(rejected.reason, size)
                log.debug("payload from %s rejected: %s", peer, rejected)
        self._inbox = later

    def _sync_peers(self) -> None:
        membership = self.node.membership
        self.algorithm.set_peers([peer.node_id for peer in membership.peers.values()])

    def _addresses(self, node_ids: tuple[str, ...]) -> tuple[str, ...]:
        by_id = {peer.node_id: peer.address for peer in self.node.membership.peers.values()}
        return tuple(by_id[n] for n in node_ids if n in by_id)

    # --- the rounds ----------------------------------------------------------------------

    async def run(self) -> None:
        settings = self.settings
        await self._wait_for_peers()
        while self.round < settings.rounds:
            await self._one_round(self.round)
            self.completed = self.round
            self.round = self._next_round(self.round)
        self.phase = "done"
        log.info("all %d rounds done", settings.rounds)

    async def _wait_for_peers(self) -> None:
        self.phase = "waiting for peers"
        with trio.move_on_after(self.settings.start_timeout_s):
            while len(self.node.membership.peers) < self.settings.start_peers:
                await trio.sleep(0.05)

    async def _one_round(self, round: int) -> None:
        node, algorithm, metrics = self.node, self.algorithm, self.node.metrics
        node.round = round
        started = trio.current_time()
        self.phase = "local step"
        report = await trio.to_thread.run_sync(algorithm.local_step, round, limiter=self._limiter)
        stepped = trio.current_time()
        self._sync_peers()
        await self._deliver_and_answer()
        self.phase = "publish"
        for out in algorithm.publish(round):
            seq = await node.send_payload(self._addresses(out.to), out.body)
            if seq is not None:
                algorithm.published(round, out, seq)
        self.phase = "gather"
        expected = set(algorithm.expected(round))
        await self._gather(round, expected)
        gathered = trio.current_time()
        arrived = expected & self._arrived(round)
        self._sync_peers()
        await self._deliver_and_answer()
        self.phase = "aggregate"
        await trio.to_thread.run_sync(algorithm.end_round, round, limiter=self._limiter)
        evaluation = await trio.to_thread.run_sync(algorithm.evaluate, limiter=self._limiter)
        self._heard = {r: peers for r, peers in self._heard.items() if r > round}
        traffic = metrics.learning_traffic()
        self.history.append(
            {
                "round": round,
                "accuracy": evaluation.accuracy,
                "own_class_accuracy": evaluation.own_class_accuracy,
                "loss": report.loss,
                "weights": algorithm.weights(),
                "expected": len(expected),
                "arrived": len(arrived),
                "missing": sorted(expected - arrived),
                "step_s": round_s(stepped - started),
                "gather_s": round_s(gathered - stepped),
                "round_s": round_s(trio.current_time() - started),
                **traffic,
            }
        )
        if self.settings.checkpoint and self.checkpoint_path is not None:
            self.phase = "checkpoint"
            state = {
                "format": CHECKPOINT_FORMAT,
                "algorithm": algorithm.name,
                "round": round,
                "state": algorithm.state_dict(),
                "history": list(self.history),
            }
            await trio.to_thread.run_sync(save_checkpoint, self.checkpoint_path, state, limiter=self._limiter)
        log.info(
            "round %d: accuracy %.3f, %d/%d expected payloads, %.2f s",
            round,
            evaluation.accuracy,
            len(arrived),
            len(expected),
            trio.current_time() - started,
            extra={"round": round, "accuracy": evaluation.accuracy, "arrived": len(arrived), "expected": len(expected)},
        )

    async def _gather(self, round: int, expected: set[str]) -> None:
        """Wait for the expected payloads of `round`: all of them, but once a quorum is in only
        `straggler_grace_s` longer, and never past the round deadline. A peer that stopped
        sending to us (its learned weight for us went to zero, or it died) costs one grace
        period, not a deadline, and the next round no longer expects it."""
        settings = self.settings

        async def until(count: int) -> None:
            while len(expected & self._arrived(round)) < count:
                self._arrival = trio.Event()
                await self._arrival.wait()
                # Shielded: answers already taken from the algorithm must go out even if the
                # deadline falls meanwhile, or the peer waits for them in vain.
                with trio.CancelScope(shield=True):
                    await self._deliver_and_answer()

        with trio.move_on_after(settings.round_deadline_s):
            await until(math.ceil(settings.quorum * len(expected)))
            with trio.move_on_after(settings.straggler_grace_s):
                await until(len(expected))

    async def _deliver_and_answer(self) -> None:
        """Hand over what arrived and send the answers it is owed (computed in a worker thread:
        scoring a model runs it on a batch)."""
        self._deliver()
        answers = await trio.to_thread.run_sync(self.algorithm.respond, limiter=self._limiter)
        for out in answers:
            seq = await self.node.send_payload(self._addresses(out.to), out.body, round=out.round)
            if seq is not None:
                self.algorithm.published(self.round if out.round is None else out.round, out, seq)

    def _next_round(self, round: int) -> int:
        """round + 1, unless the peers this node learns from are further ahead than the queue
        reaches (it was down, or it is much slower): then it joins them instead of replaying
        rounds whose payloads are gone. Peers it does not learn from (another cluster, say)
        may run at their own pace and do not pull it along."""
        weights = self.algorithm.weights()
        heard = self._heard_this_round
        self._heard_this_round = set()
        sources = [p for p in heard if weights.get(p, 0.0) > 0] or list(heard)
        if not sources:
            return round + 1
        typical = int(statistics.median_low(self._peer_round[p] for p in sources))
        if typical > round + 1 + self.settings.max_rounds_ahead:
            self.catch_ups += 1
            log.info("catching up: peers are at round %d, this node finished %d", typical, round)
            return typical
        return round + 1

    # --- checkpoints ---------------------------------------------------------------------

    def resume(self) -> None:
        """Continue from the checkpoint, if there is one."""
        if not self.settings.checkpoint or self.checkpoint_path is None or not self.checkpoint_path.exists():
            return
        state = load_checkpoint(self.checkpoint_path)
        if state.get("format") != CHECKPOINT_FORMAT or state.get("algorithm") != self.algorithm.name:
            raise CheckpointError(
                f"{self.checkpoint_path} was written by another algorithm or format "
                f"({state.get('algorithm')!r}, format {state.get('format')!r}); move it away to start afresh"
            )
        try:
            self.algorithm.load_state_dict(state["state"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"{self.checkpoint_path}: {exc}") from None
        self.history.extend(state.get("history", []))
        self.completed = int(state["round"])
        self.round = self.completed + 1
        self.resumed_from = self.completed
        log.info("resumed from the checkpoint of round %d", self.completed)

    def status(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {
            "algorithm": None if self.algorithm is None else self.algorithm.name,
            "phase": self.phase,
            "round": self.round,
            "rounds": self.settings.rounds,
            "completed": self.completed,
            "resumed_from": self.resumed_from,
            "catch_ups": self.catch_ups,
            "accuracy": None if last is None else last["accuracy"],
            "neighbours": {} if last is None else {k: v for k, v in last["weights"].items() if v > 0},
            "missing_payloads": {} if self.algorithm is None else dict(sorted(self.algorithm.missing.items())),
            "inbox": len(self._inbox),
            "history": list(self.history),
        }


def round_s(seconds: float) -> float:
    return round(seconds, 4)


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomically(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    try:
        # weights_only: tensors and plain containers only; a tampered file cannot run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); move it away to start afresh"
        ) from None
    if not isinstance(state, dict) or "round" not in state or "state" not in state:
        raise CheckpointError(f"{path} is not a p2pnode checkpoint")
    return state
