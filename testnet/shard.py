"""The nodes one host of a simulation owns, and what they do in a round (testnet/exchange.py
routes between hosts).

Each node runs the daemon's round engine (p2pnode/engine.py: what is published and accepted,
who arrived, the round's `RoundRecord`); a shard only routes. It answers the exchange's
per-round commands for its own nodes: `step` (local steps, then each node's payloads encoded and
signed exactly as the daemon would put them on the wire), `deliver` (frames from any node of the
run, decoded by the protocol decoder and offered to their addressees' engines here, in the order
given, as the daemon offers what comes off its sockets; then the answers they are owed, signed),
`finish` (graph step, evaluation, one record per node). What a sender counts (sequence numbers,
frames and bytes sent, whom it sent to) lives with the sender's shard, what a receiver counts
(what arrived, rejections) with the receiver's, so the records do not depend on how the nodes
are spread over hosts.

The simulator has no clock yet (the exchange is perfect and lock-step): a record's `step_s` is
the node's own local step measured in wall time, `round_s` its own work in the round (local
step, end of round, evaluation) in wall time, `gather_s` 0.0 (nobody waits); `discovery_sent`
is empty, as there is no discovery.

A poisoning node (algorithms/poison.py) may sign with looser limits (`sender_limits`), as an
attacker would; the decoders keep the real ones, and a frame one refuses is counted as a
rejection by its reason for each addressee, as a daemon counts it.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.seam import Algorithm, Outbound
from p2pnode.config import AlgorithmSettings
from p2pnode.engine import RoundEngine, Timings, round_state
from p2pnode.metrics import SentTraffic
from p2pnode.rounds import RoundRecord
from protocol import DEFAULT_LIMITS, LEARNING_TYPES, Decoder, Encoder, Identity, Limits, ProtocolError

__all__ = ["Shard", "Sent", "SimulationError", "NodeFailed", "simulation_identity", "NETWORK"]

NETWORK = "p2pnode-sim"


def simulation_identity(seed: int, node: int) -> Identity:
    """Node `node`'s key in a simulation of `seed` (derived, so runs repeat exactly)."""
    secret = hashlib.sha256(f"p2pnode-sim/{seed}/{node}".encode()).digest()
    return Identity(Ed25519PrivateKey.from_private_bytes(secret))


class SimulationError(RuntimeError):
    """A simulation that cannot go on; the message names the node or the worker at fault."""


class NodeFailed(SimulationError):
    """A node's algorithm raised: the message names the node, the call and the error."""


@dataclass(frozen=True)
class Sent:
    """One signed frame on its way: who sent it, its round tag, its addressees, its bytes."""

    sender: int  # the sender's node index
    round: int
    to: tuple[str, ...]
    frame: bytes


class Shard:
    def __init__(
        self,
        nodes: Mapping[int, Algorithm],
        identities: Mapping[int, Identity],
        ids: Sequence[str],
        sender_limits: Mapping[int, Limits] | None = None,
    ) -> None:
        """`nodes`: this shard's nodes by index in the run; `identities`: their keys; `ids`: the
        node ids of the whole run, in index order; `sender_limits`: node index → the limits its
        encoder signs with (default: the real ones)."""
        if set(nodes) != set(identities):
            raise ValueError(f"nodes {sorted(nodes)} but identities of {sorted(identities)}")
        self.nodes = dict(sorted(nodes.items()))
        self.ids = list(ids)
        self.index = {node_id: i for i, node_id in enumerate(self.ids)}
        loose = dict(sender_limits or {})
        self.encoders = {i: Encoder(identities[i], NETWORK, loose.get(i, DEFAULT_LIMITS)) for i in self.nodes}
        self.decoder = Decoder(NETWORK)
        self.rejections: Counter[str] = Counter()
        self._seq = dict.fromkeys(self.nodes, 0)
        self._sent = {i: SentTraffic() for i in self.nodes}  # learning frames each node sent so far
        # Each node's engine, bound as a daemon's is by default; it keeps one record (the
        # simulator keeps them all).
        settings = AlgorithmSettings()
        self.engines = {i: RoundEngine(round_state(settings, history_rounds=1)) for i in self.nodes}
        self._step_s: dict[int, float] = {}  # this round's local steps, wall time
        for i, node in self.nodes.items():
            self.engines[i].attach(node)
            with self._blame(i, "set_peers"):
                node.set_peers(self.ids)

    # --- the exchange's commands -----------------------------------------------------------

    def step(self, round: int) -> list[Sent]:
        """Every node's local step and what it publishes, signed."""
        for i, engine in self.engines.items():
            engine.begin(round)
            started = time.perf_counter()
            with self._blame(i, "local_step"):
                engine.step(round)
            self._step_s[i] = time.perf_counter() - started
        outbox = []
        for i, engine in self.engines.items():
            with self._blame(i, "publish"):
                outbox.extend((i, out) for out in engine.publish(round))
        for i, engine in self.engines.items():
            with self._blame(i, "expected"):
                engine.expect(round)
        return self._send(round, outbox)

    def deliver(self, round: int, frames: Sequence[Sent]) -> list[Sent]:
        """Hand `frames` to the addressees here, in order; returns the answers they are owed."""
        for sent in frames:
            self._receive(sent)
        outbox = []
        for i, engine in self.engines.items():
            with self._blame(i, "receive"):
                refused = engine.deliver()
            self.rejections.update(rejected.reason for _, rejected in refused)
            with self._blame(i, "respond"):
                outbox.extend((i, out) for out in engine.respond())
        return self._send(round, outbox)

    def finish(self, round: int) -> list[RoundRecord]:
        """Every node's end of round and evaluation, as records in node order."""
        records = []
        for i, engine in self.engines.items():
            engine.close_gather()
            started = time.perf_counter()
            with self._blame(i, "end_round"):
                engine.end_round(round)
                evaluation = self.nodes[i].evaluate()
            step_s = self._step_s[i]
            timings = Timings(step_s, 0.0, step_s + time.perf_counter() - started)
            with self._blame(i, "end_round"):
                records.append(engine.record(evaluation, timings, self._sent[i].of(LEARNING_TYPES)))
        return records

    def rejected(self) -> dict[str, int]:
        """Payloads refused by this shard's nodes so far, by reason."""
        return dict(self.rejections)

    # --- frames out and in -----------------------------------------------------------------

    def _send(self, round: int, outbox: list[tuple[int, Outbound]]) -> list[Sent]:
        """Sign each payload once, as the daemon does, and count it for its sender."""
        frames = []
        for sender, out in outbox:
            node = self.nodes[sender]
            if out.body.TYPE not in node.sends:  # its peers would refuse it: a bug, not a rejection
                raise NodeFailed(f"{self._name(sender)} published a {out.body.TYPE}, which it does not declare")
            unknown = [peer for peer in out.to if peer not in self.index]
            if unknown:
                raise NodeFailed(f"{self._name(sender)} addressed {unknown[:3]}, which are not nodes of this run")
            tag = RoundEngine.tag(out, round)
            self._seq[sender] += 1
            seq = self._seq[sender]
            with self._blame(sender, "publish (signing its payload)"):
                frame = self.encoders[sender].encode(out.body, seq=seq, timestamp_us=0, round=tag)
            with self._blame(sender, "published"):
                self.engines[sender].published(tag, out, out.to, seq)
            self._sent[sender].count(out.body.TYPE, len(frame), out.body.payload_bytes(), copies=len(out.to))
            frames.append(Sent(sender, tag, out.to, frame))
        return frames

    def _receive(self, sent: Sent) -> None:
        """Decode `sent` once and offer it to each of its addressees' engines in this shard."""
        here = [self.index[peer] for peer in sent.to if self.index[peer] in self.nodes]
        if not here:
            return
        try:
            envelope = self.decoder.decode(sent.frame)
        except ProtocolError as refused:  # only a sender with looser limits gets here
            self.rejections[str(refused.reason)] += len(here)
            return
        sender = self.ids[sent.sender]
        for receiver in here:
            refusal = self.engines[receiver].offer(sender, sent.round, envelope)
            if refusal is not None:
                self.rejections[refusal] += 1

    # --- errors ----------------------------------------------------------------------------

    def _name(self, i: int) -> str:
        return f"node {i} ({self.ids[i]}, {self.nodes[i].name})"

    @contextmanager
    def _blame(self, i: int, call: str) -> Iterator[None]:
        """Turn what a node's algorithm raises into an error that names the node and the call."""
        try:
            yield
        except SimulationError:
            raise
        except Exception as exc:
            raise NodeFailed(f"{self._name(i)} failed in {call}: {type(exc).__name__}: {exc}") from exc
