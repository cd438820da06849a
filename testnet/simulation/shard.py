"""The nodes one host of a simulation owns, and what they do on the simulated clock
(testnet/simulation/exchange.py routes between hosts and keeps the clock, testnet/simulation/clock.py).

Each node runs the daemon's round engine (p2pnode/learning/engine.py: what is published and accepted,
who arrived, when the gather ends, the round's `RoundRecord`); a shard only routes. It answers
the exchange's commands for whichever of its nodes they name, at the simulated time they give:
`begin` (a round begins: its local step, run at once), `step` (local steps end: the payloads
that came meanwhile delivered and answered, as the daemon does after its step; then each node's
payloads, encoded and signed exactly as the daemon would put them on the wire; then its gather
opens), `deliver` (frames from any node of the run, decoded by
the protocol decoder and offered to their addressees' engines here, in the order given, as the
daemon offers what comes off its sockets; a node whose gather is open takes them and answers
what it owes at once, a node still stepping finds them queued after its step, a node that closed
its gather gets the late ones next round, as in the daemon), `close` (the gathers the daemon's
rule ends now: graph step, evaluation, one record per node, whose round ends when its end of
round's cost has passed), `advance` (the rounds that end now: the next round chosen from what
came until now, as the daemon chooses it after its end of round, or the node is done). What a sender
counts (sequence numbers, frames and bytes sent, whom it sent to) lives with the sender's shard,
what a receiver counts (what arrived, rejections) with the receiver's, so the records do not
depend on how the nodes are spread over hosts.

A record's `step_s`, `gather_s`, `round_s` and `ended_at` are simulated seconds (`ended_at`
since the run began); `discovery_sent` is empty, as there is no discovery.

A poisoning node (algorithms/methods/poison.py) may sign with looser limits (`sender_limits`), as an
attacker would; the decoders keep the real ones, and a frame one refuses is counted as a
rejection by its reason for each addressee, as a daemon counts it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.interface import Algorithm, Outbound
from p2pnode.learning.engine import RoundEngine, Timings, round_state
from p2pnode.learning.rounds import Gather, RoundRecord, Schedule
from p2pnode.learning.settings import AlgorithmSettings
from p2pnode.metrics import SentTraffic
from protocol import DEFAULT_LIMITS, LEARNING_TYPES, Decoder, Encoder, Identity, Limits, ProtocolError

__all__ = ["Shard", "Sent", "GatherRule", "Closed", "SimulationError", "NodeFailed", "simulation_identity", "NETWORK"]

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


@dataclass(frozen=True)
class GatherRule:
    """When a gather ends: `[algorithm].quorum`, `round_deadline_s`, `straggler_grace_s`."""

    quorum: float
    deadline_s: float
    grace_s: float

    @classmethod
    def of(cls, settings: AlgorithmSettings) -> GatherRule:
        return cls(settings.quorum, settings.round_deadline_s, settings.straggler_grace_s)


@dataclass(frozen=True)
class Closed:
    """What `close` did: the records of the gathers it ended (in node order), and when each
    gather still open ends at the latest if nothing more comes."""

    records: list[RoundRecord]
    wakes: dict[int, float]
    sent: list[Sent]  # the answers owed for what the ended rounds were handed last, signed


class Shard:
    def __init__(
        self,
        nodes: Mapping[int, Algorithm],
        identities: Mapping[int, Identity],
        ids: Sequence[str],
        sender_limits: Mapping[int, Limits] | None = None,
        schedule: Schedule | None = None,
        rounds: int = 1_000_000,
    ) -> None:
        """`nodes`: this shard's nodes by index in the run; `identities`: their keys; `ids`: the
        node ids of the whole run, in index order; `sender_limits`: node index → the limits its
        encoder signs with (default: the real ones); `schedule`: `[algorithm].schedule` and what
        goes with it (default: sync, fixed deadline); `rounds`: the run's (`[algorithm].rounds`)."""
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
        # Each node's engine, bound as a daemon's is by default but for the run's rounds; it keeps
        # one record (the simulator keeps them all).
        settings = AlgorithmSettings(rounds=rounds)
        self.engines = {i: RoundEngine(round_state(settings, history_rounds=1), schedule) for i in self.nodes}
        self._gathers: dict[int, Gather] = {}  # the open gathers, by node
        self._began: dict[int, tuple[float, float]] = {}  # node → (round began, step ended), simulated
        self._stepped: set[int] = set()  # nodes whose local step `begin` ran, its end not yet come
        for i, node in self.nodes.items():
            self.engines[i].attach(node)
            with self._blame(i, "set_peers"):
                node.set_peers(self.ids)

    # --- the exchange's commands -----------------------------------------------------------

    def begin(self, nodes: Sequence[int]) -> None:
        """`nodes` begin their round: their local steps, run now, as they depend on nothing that
        arrives before they end (it is queued; `step` hands it over)."""
        for i in nodes:
            self.engines[i].begin(self.engines[i].round)
            with self._blame(i, "local_step"):
                self.engines[i].step(self.engines[i].round)
            self._stepped.add(i)

    def step(self, now: float, began: Mapping[int, float], rule: GatherRule) -> list[Sent]:
        """The local steps of the nodes in `began` (node → when its round began), run by `begin`,
        end at `now`; what came meanwhile delivered and answered, then what they publish, signed;
        their gathers open."""
        stepping = sorted(began)
        for i in stepping:
            if i not in self._stepped:
                raise SimulationError(f"{self._name(i)}: its step ends, but its round never began")
            self._stepped.discard(i)
            self._began[i] = (began[i], now)
        outbox = []
        for i in stepping:
            outbox.extend(self._delivered(i))
            with self._blame(i, "publish"):
                outbox.extend((i, out) for out in self.engines[i].publish(self.engines[i].round))
        for i in stepping:
            engine = self.engines[i]
            with self._blame(i, "expected"):
                engine.expect(engine.round)
            self._gathers[i] = engine.gather(now, quorum=rule.quorum, deadline_s=rule.deadline_s, grace_s=rule.grace_s)
        return self._send(outbox)

    def deliver(self, frames: Sequence[Sent]) -> list[Sent]:
        """Offer `frames` to their addressees here, in order; those gathering take them and
        answer; returns the answers, signed."""
        for sent in frames:
            self._receive(sent)
        reached = {self.index[peer] for sent in frames for peer in sent.to}
        outbox = []
        for i in sorted(reached & self._gathers.keys()):
            outbox.extend(self._delivered(i))
        return self._send(outbox)

    def close(self, now: float, end_s: Mapping[int, float]) -> Closed:
        """End the gathers the daemon's rule ends at `now`: end of round, evaluation, record (the
        round ends `end_s[i]` later, what node i's end of round costs; `advance` then)."""
        records, wakes, outbox = [], {}, []
        for i in sorted(self._gathers):
            engine, gather = self.engines[i], self._gathers[i]
            if not engine.gather_finished(gather, now):
                wakes[i] = gather.wake_at()
                continue
            del self._gathers[i]
            engine.close_gather()
            outbox.extend(self._delivered(i))  # as the daemon does before its end of round
            records.append(self._end_round(i, now, end_s[i]))
        return Closed(records, wakes, self._send(outbox))

    def advance(self, nodes: Sequence[int]) -> list[int]:
        """The rounds of `nodes` end now: each goes on to the round `RoundState.next_round`
        chooses from what came so far, unless it is done (`RoundEngine.done`: its rounds, and
        async its overtime); returns those that go on."""
        going_on = []
        for i in nodes:
            engine = self.engines[i]
            engine.next_round([peer for peer in self.ids if peer != self.ids[i]])
            if not engine.done():
                going_on.append(i)
        return going_on

    def sizes(self) -> dict[int, tuple[int, int]]:
        """Each node's training and test images (what its local step and its end of round cost:
        testnet/simulation/clock.py)."""
        return {
            i: (len(node.setup.data.train_labels), len(node.setup.data.test_labels)) for i, node in self.nodes.items()
        }

    def _delivered(self, i: int) -> list[tuple[int, Outbound]]:
        """Node i takes its queued payloads; the answers it owes."""
        with self._blame(i, "receive"):
            refused = self.engines[i].deliver()
        self.rejections.update(rejected.reason for _, rejected in refused)
        with self._blame(i, "respond"):
            return [(i, out) for out in self.engines[i].respond()]

    def _end_round(self, i: int, now: float, end_s: float) -> RoundRecord:
        """Node i's gather closed at `now`; its round ends `end_s` later."""
        engine, (began, stepped) = self.engines[i], self._began[i]
        with self._blame(i, "end_round"):
            engine.end_round(engine.round)
            evaluation = self.nodes[i].evaluate()
            timings = Timings(stepped - began, now - stepped, now + end_s - began, now + end_s)
            return engine.record(evaluation, timings, self._sent[i].of(LEARNING_TYPES))

    def rejected(self) -> dict[str, int]:
        """Payloads refused by this shard's nodes so far, by reason."""
        return dict(self.rejections)

    # --- frames out and in -----------------------------------------------------------------

    def _send(self, outbox: list[tuple[int, Outbound]]) -> list[Sent]:
        """Sign each payload once, as the daemon does, and count it for its sender."""
        frames = []
        for sender, out in outbox:
            if out.body.TYPE not in self.engines[sender].sends:  # its peers would refuse it: a bug, not a rejection
                raise NodeFailed(f"{self._name(sender)} published a {out.body.TYPE}, which it does not declare")
            unknown = [peer for peer in out.to if peer not in self.index]
            if unknown:
                raise NodeFailed(f"{self._name(sender)} addressed {unknown[:3]}, which are not nodes of this run")
            tag = RoundEngine.tag(out, self.engines[sender].round)
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
