"""The nodes one host of a simulation owns, and what they do in a round (testnet/exchange.py
routes between hosts).

A shard answers the exchange's per-round commands for its own nodes: `step` (local steps,
then each node's payloads encoded and signed exactly as the daemon would put them on the
wire), `deliver` (frames from any node of the run, decoded by the protocol decoder and handed
to their addressees here, in the order given; then the answers they are owed, signed), `finish`
(graph step, evaluation, one `RoundRecord` per node). What a sender counts (sequence numbers,
frames and bytes sent, whom it sent to) lives with the sender's shard, what a receiver counts
(what arrived, rejections) with the receiver's, so the records do not depend on how the nodes
are spread over hosts.

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

from algorithms.seam import Algorithm, Frame, LocalReport, Outbound, PayloadRejected
from p2pnode.rounds import RoundRecord, arrived
from protocol import DEFAULT_LIMITS, Decoder, Encoder, Identity, Limits, MessageType, ProtocolError

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
        # learning frames sent by each node so far, by type: [messages, bytes, payload bytes]
        self._sent: dict[int, dict[MessageType, list[int]]] = {i: {} for i in self.nodes}
        self._round = _RoundState()
        for i, node in self.nodes.items():
            with self._blame(i, "set_peers"):
                node.set_peers(self.ids)

    # --- the exchange's commands -----------------------------------------------------------

    def step(self, round: int) -> list[Sent]:
        """Every node's local step and what it publishes, signed."""
        state = self._round = _RoundState()
        for i, node in self.nodes.items():
            started = time.perf_counter()
            with self._blame(i, "local_step"):
                state.reports[i] = node.local_step(round)
            state.step_s[i] = time.perf_counter() - started
        outbox = []
        for i, node in self.nodes.items():
            with self._blame(i, "publish"):
                outbox.extend((i, out) for out in node.publish(round))
        for i, node in self.nodes.items():
            with self._blame(i, "expected"):
                state.expected[i] = set(node.expected(round))
        return self._send(round, outbox)

    def deliver(self, round: int, frames: Sequence[Sent]) -> list[Sent]:
        """Hand `frames` to the addressees here, in order; returns the answers they are owed."""
        for sent in frames:
            self._receive(round, sent)
        outbox = []
        for i, node in self.nodes.items():
            with self._blame(i, "respond"):
                outbox.extend((i, out) for out in node.respond())
        return self._send(round, outbox)

    def finish(self, round: int) -> list[RoundRecord]:
        """Every node's end of round and evaluation, as records in node order."""
        state, records = self._round, []
        for i, node in self.nodes.items():
            with self._blame(i, "end_round"):
                node.end_round(round)
                evaluation = node.evaluate()
                weights = node.weights()
            came = state.expected[i] & arrived(state.heard.get(i, {}), node.waits_for)
            records.append(
                RoundRecord(
                    node=self.ids[i],
                    round=round,
                    accuracy=evaluation.accuracy,
                    own_class_accuracy=evaluation.own_class_accuracy,
                    loss=state.reports[i].loss,
                    test_loss=evaluation.loss,
                    weights=weights,
                    expected=len(state.expected[i]),
                    arrived=len(came),
                    missing=tuple(sorted(state.expected[i] - came)),
                    recipients=len(state.recipients.get(i, ())),
                    sent={kind: (m, b, p) for kind, (m, b, p) in sorted(self._sent[i].items())},
                    step_s=state.step_s[i],
                    accuracy_by_predictor=evaluation.by_predictor,
                    test_samples=evaluation.total,
                )
            )
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
            tag = round if out.round is None else out.round
            self._seq[sender] += 1
            seq = self._seq[sender]
            with self._blame(sender, "publish (signing its payload)"):
                frame = self.encoders[sender].encode(out.body, seq=seq, timestamp_us=0, round=tag)
            with self._blame(sender, "published"):
                node.published(tag, out, seq)
            counts = self._sent[sender].setdefault(out.body.TYPE, [0, 0, 0])
            payload = out.body.payload_bytes()
            counts[0] += len(out.to)
            counts[1] += len(frame) * len(out.to)
            counts[2] += payload * len(out.to)
            self._round.recipients.setdefault(sender, set()).update(out.to)
            frames.append(Sent(sender, tag, out.to, frame))
        return frames

    def _receive(self, round: int, sent: Sent) -> None:
        """Decode `sent` once and hand its body to each of its addressees in this shard."""
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
            if sent.round == round:
                self._round.heard.setdefault(receiver, {}).setdefault(sender, set()).add(envelope.body.TYPE)
            with self._blame(receiver, "receive"):
                try:
                    self.nodes[receiver].receive(
                        sender, sent.round, envelope.body, Frame(envelope.seq, envelope.sender)
                    )
                except PayloadRejected as rejected:
                    self.rejections[rejected.reason] += 1

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


class _RoundState:
    """What a shard learns about its nodes during one round, for their records."""

    def __init__(self) -> None:
        self.reports: dict[int, LocalReport] = {}
        self.step_s: dict[int, float] = {}
        self.expected: dict[int, set[str]] = {}
        self.recipients: dict[int, set[str]] = {}  # whom each node sent anything this round
        self.heard: dict[int, dict[str, set[MessageType]]] = {}  # this round's payloads, by sender
