"""The simulator's network: every node of a run in one process, a perfect synchronous exchange.

Each round every node steps and publishes; every payload is encoded and signed exactly as the
daemon would put it on the wire, decoded once by the protocol decoder, and handed to its
addressees before anyone's graph step; then answers (SCooL's scores), and answers to those,
until nobody owes anything. So the traffic counted is real frame bytes, and a payload an
algorithm could not send over the network fails here first. Each node-round yields the same
`RoundRecord` the daemon's round driver writes, so one report builder serves both.

A poisoning node (algorithms/poison.py) may sign with looser limits (`sender_limits`), as an
attacker would; its peers' decoder keeps the real ones, and a frame it refuses is counted as a
rejection by its reason for each addressee, as a daemon counts it.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.seam import Algorithm, Frame, Outbound, PayloadRejected
from p2pnode.rounds import RoundRecord, arrived
from protocol import DEFAULT_LIMITS, Decoder, Encoder, Identity, Limits, MessageType, ProtocolError

__all__ = ["Exchange", "simulation_identity", "NETWORK", "MAX_ANSWER_PASSES"]

NETWORK = "p2pnode-sim"
MAX_ANSWER_PASSES = 4  # answers to answers to ...: a bound, so a faulty algorithm cannot loop


def simulation_identity(seed: int, node: int) -> Identity:
    """Node `node`'s key in a simulation of `seed` (derived, so runs repeat exactly)."""
    secret = hashlib.sha256(f"p2pnode-sim/{seed}/{node}".encode()).digest()
    return Identity(Ed25519PrivateKey.from_private_bytes(secret))


class Exchange:
    def __init__(
        self,
        nodes: Sequence[Algorithm],
        identities: Sequence[Identity],
        sender_limits: Mapping[int, Limits] | None = None,
    ) -> None:
        """`sender_limits`: node index → the limits its encoder signs with (default: the real ones)."""
        if len(nodes) != len(identities):
            raise ValueError(f"{len(nodes)} nodes but {len(identities)} identities")
        self.nodes = list(nodes)
        self.ids = [identity.node_id for identity in identities]
        self.index = {node_id: i for i, node_id in enumerate(self.ids)}
        loose = dict(sender_limits or {})
        self.encoders = [
            Encoder(identity, NETWORK, loose.get(i, DEFAULT_LIMITS)) for i, identity in enumerate(identities)
        ]
        self.decoder = Decoder(NETWORK)
        self.rejections: Counter[str] = Counter()
        self._seq = [0] * len(nodes)
        # learning frames sent by each node so far, by type: [messages, bytes, payload bytes]
        self._sent: list[dict[MessageType, list[int]]] = [{} for _ in nodes]
        for node in self.nodes:
            node.set_peers(self.ids)

    def run_round(self, round: int) -> list[RoundRecord]:
        """Every node's round `round`; returns their records, in node order."""
        reports, step_s = [], []
        for node in self.nodes:
            started = time.perf_counter()
            reports.append(node.local_step(round))
            step_s.append(time.perf_counter() - started)
        recipients: list[set[str]] = [set() for _ in self.nodes]  # whom each node sent anything this round
        heard: list[dict[str, set[MessageType]]] = [{} for _ in self.nodes]  # this round's payloads, by sender
        outbox = [(i, out) for i, node in enumerate(self.nodes) for out in node.publish(round)]
        expected = [set(node.expected(round)) for node in self.nodes]
        for passes in range(MAX_ANSWER_PASSES + 2):
            if not outbox:
                break
            if passes > MAX_ANSWER_PASSES:
                raise RuntimeError(f"still answering after {MAX_ANSWER_PASSES} passes in round {round}")
            for sender, out in outbox:
                tag = round if out.round is None else out.round
                self._deliver(sender, out, tag, heard if tag == round else None)
                recipients[sender].update(out.to)
            outbox = [(i, out) for i, node in enumerate(self.nodes) for out in node.respond()]
        records = []
        for i, node in enumerate(self.nodes):
            node.end_round(round)
            evaluation = node.evaluate()
            came = expected[i] & arrived(heard[i], node.waits_for)
            records.append(
                RoundRecord(
                    node=self.ids[i],
                    round=round,
                    accuracy=evaluation.accuracy,
                    own_class_accuracy=evaluation.own_class_accuracy,
                    loss=reports[i].loss,
                    test_loss=evaluation.loss,
                    weights=node.weights(),
                    expected=len(expected[i]),
                    arrived=len(came),
                    missing=tuple(sorted(expected[i] - came)),
                    recipients=len(recipients[i]),
                    sent={kind: (m, b, p) for kind, (m, b, p) in sorted(self._sent[i].items())},
                    step_s=step_s[i],
                    accuracy_by_predictor=evaluation.by_predictor,
                    test_samples=evaluation.total,
                )
            )
        return records

    def _deliver(self, sender: int, out: Outbound, tag: int, heard: list[dict[str, set[MessageType]]] | None) -> None:
        """Sign `out` once, as the daemon does, and hand the decoded body to each addressee."""
        if out.body.TYPE not in self.nodes[sender].sends:  # its peers would refuse it: a bug, not a rejection
            raise RuntimeError(f"{self.nodes[sender].name} published a {out.body.TYPE}, which it does not declare")
        self._seq[sender] += 1
        seq = self._seq[sender]
        frame = self.encoders[sender].encode(out.body, seq=seq, timestamp_us=0, round=tag)
        try:
            envelope = self.decoder.decode(frame)
        except ProtocolError as refused:  # only a sender with looser limits gets here
            envelope, reason = None, str(refused.reason)
        self.nodes[sender].published(tag, out, seq)
        counts = self._sent[sender].setdefault(out.body.TYPE, [0, 0, 0])
        payload = out.body.payload_bytes()
        for peer in out.to:
            counts[0] += 1
            counts[1] += len(frame)
            counts[2] += payload
            if envelope is None:
                self.rejections[reason] += 1
                continue
            receiver = self.index[peer]
            if heard is not None:
                heard[receiver].setdefault(self.ids[sender], set()).add(out.body.TYPE)
            try:
                self.nodes[receiver].receive(self.ids[sender], tag, envelope.body, Frame(envelope.seq, envelope.sender))
            except PayloadRejected as rejected:
                self.rejections[rejected.reason] += 1
