"""The simulator's network: real signed frames between the hosts that own a run's nodes, on a
simulated clock (testnet/simulation/clock.py).

Each node runs its own rounds: its local step takes its step cost in simulated seconds, then it
publishes; every payload is encoded and signed exactly as the daemon would put it on the wire,
arrives `latency_s` later, is decoded by the protocol decoder and handed to its addressees; a
node's gather ends by the daemon's rule (`GatherRule`: quorum, grace, deadline), and a payload
that comes after it is queued for the node's next round, as in the daemon. So the traffic counted
is real frame bytes, a payload an algorithm could not send over the network fails here first,
and a slow node holds its neighbours back exactly as long as the daemon's rule lets it. Each
node-round yields the same `RoundRecord` the daemon's round driver writes, its `ended_at` in
simulated seconds, so one report builder serves both.

With equal step costs and no latency the nodes move in lock-step, as the simulator did before it
had a clock: all step, all payloads arrive (in the order of their senders' indices), the answers
they are owed arrive, and only then are the gathers looked at.

Who owns which nodes is apart from who routes frames: a host (testnet/simulation/shard.py) owns a shard of
the nodes and answers commands for the nodes they name; the `Timeline` keeps the clock, routes
frames between hosts and does not care where they run (in this process, in worker processes, on
Ray: testnet/simulation/hosting.py). Events at one instant go to every host they concern at once, and the
order a node sees is the one it would see with every node in one process.

Hosts work in parallel although the nodes' events come one at a time: a node's local step
depends only on its state when its round begins (what arrives meanwhile is queued until after
it, as in the daemon), so its host is told to run it then (`begin`, posted: not waited for) and
the Timeline goes on with the events of the other hosts; only the commands whose answers it
needs (the step's payloads, a gathering node's answers, a gather's end) wait for a host, and a
host is called only for the events of its own nodes. A host runs its commands in the order they
were sent, so the result does not depend on how long any of them took.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from algorithms.interface import Algorithm
from p2pnode.learning.rounds import RoundRecord, Schedule
from p2pnode.learning.settings import AlgorithmSettings
from protocol import Identity, Limits

from .clock import ARRIVAL, BEGIN, CLOSE, STEP, EventQueue
from .shard import NETWORK, Closed, GatherRule, Sent, Shard, simulation_identity

__all__ = [
    "Arguments",
    "Exchange",
    "Hosts",
    "InlineHosts",
    "Timeline",
    "GatherRule",
    "simulation_identity",
    "NETWORK",
    "MAX_ANSWER_PASSES",
]

MAX_ANSWER_PASSES = 4  # answers to answers to ... at one instant: a bound, so a faulty algorithm cannot loop


Arguments = tuple[Any, ...] | None  # one host's arguments to a command; None: not this host


class Hosts(Protocol):
    """The hosts of a run, wherever they are: `blocks[h]` are the node indices host h owns.
    `call` runs one shard command on the hosts whose arguments are not None, at once, and
    returns their answers in host order (None for a host not called); `post` sends one without
    waiting for it: each host runs its commands in the order they were sent, and a posted one
    that fails raises from the next `call`."""

    blocks: Sequence[tuple[int, ...]]

    def call(self, method: str, args: Sequence[Arguments]) -> list[Any]: ...

    def post(self, method: str, args: Sequence[Arguments]) -> None: ...


class InlineHosts:
    """Shards in this process, called one after the other (a post is a call)."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        self.shards = list(shards)
        self.blocks = [tuple(shard.nodes) for shard in self.shards]

    def call(self, method: str, args: Sequence[Arguments]) -> list[Any]:
        return [
            None if arguments is None else getattr(shard, method)(*arguments)
            for shard, arguments in zip(self.shards, args, strict=True)
        ]

    def post(self, method: str, args: Sequence[Arguments]) -> None:
        self.call(method, args)


class Timeline:
    """Every node's rounds on the simulated clock: `step_s[i]` is node i's local step and
    `end_s[i]` its end of round (graph step and evaluation, after its gather; default none), in
    simulated seconds; every node begins round 0 at time 0 and stops when its engine is done
    (its hosts' shards know the run's rounds)."""

    def __init__(
        self,
        hosts: Hosts,
        ids: Sequence[str],
        step_s: Sequence[float],
        latency_s: float,
        rule: GatherRule,
        end_s: Sequence[float] | None = None,
    ) -> None:
        end_s = [0.0] * len(ids) if end_s is None else list(end_s)
        if len(step_s) != len(ids) or min(step_s) <= 0 or latency_s < 0:
            raise ValueError(f"a positive step cost per node and a latency ≥ 0, got {step_s} and {latency_s}")
        if len(end_s) != len(ids) or min(end_s) < 0:
            raise ValueError(f"an end-of-round cost ≥ 0 per node, got {end_s}")
        self.hosts, self.ids = hosts, list(ids)
        self.step_s, self.end_s, self.latency_s, self.rule = list(step_s), end_s, latency_s, rule
        self.owner = {i: host for host, block in enumerate(hosts.blocks) for i in block}
        self.position = {node_id: i for i, node_id in enumerate(self.ids)}
        self.queue = EventQueue()
        self.began = dict.fromkeys(range(len(self.ids)), 0.0)  # node → when its round in progress began
        self.running = set(self.began)  # nodes with rounds left
        self.gathering: set[int] = set()  # nodes whose gather is open (the hosts' `Shard._gathers`)
        self.now = 0.0
        self._closing: set[float] = set()  # times a CLOSE is queued for
        self._passes = (0.0, 0)  # (time, frame batches delivered at it)
        self._begin(range(len(self.ids)))

    def run(self) -> Iterator[list[RoundRecord]]:
        """Every node's rounds, to the end; yields the records of the rounds that end together,
        in node order, as they end."""
        while self.running:
            self.now, kind, items = self.queue.pop()
            if kind == STEP:
                self._step(items)
            elif kind == ARRIVAL:
                self._arrive(items)
            elif kind == BEGIN:
                self._advance(items)
            else:
                records = self._close()
                if records:
                    yield records

    def _begin(self, nodes: Iterable[int]) -> None:
        """`nodes` begin a round now: their hosts run their local steps meanwhile (posted), which
        end `step_s` later."""
        parts: list[list[int]] = [[] for _ in self.hosts.blocks]
        for i in nodes:
            self.began[i] = self.now
            self.queue.push(self.now + self.step_s[i], STEP, i, i)
            parts[self.owner[i]].append(i)
        self.hosts.post("begin", [(part,) if part else None for part in parts])

    def _step(self, nodes: list[int]) -> None:
        """The local steps of `nodes` end now; their hosts are called at once, each with its own."""
        began: list[dict[int, float]] = [{} for _ in self.hosts.blocks]
        for i in nodes:
            began[self.owner[i]][i] = self.began[i]
        self.gathering.update(nodes)
        self._sent(self.hosts.call("step", [(self.now, part, self.rule) if part else None for part in began]))

    def _arrive(self, frames: list[Sent]) -> None:
        time, passes = self._passes
        passes = passes + 1 if time == self.now else 1
        if passes > MAX_ANSWER_PASSES + 1:
            raise RuntimeError(f"still answering after {MAX_ANSWER_PASSES} passes at {self.now:.4f} s")
        self._passes = (self.now, passes)
        routed: list[list[Sent]] = [[] for _ in self.hosts.blocks]
        answering = [False] * len(self.hosts.blocks)  # a node of the host gathers: it may answer
        for sent in frames:  # in sender order, a sender's frames in the order it sent them
            hosts = set()
            for i in (self.position[peer] for peer in sent.to):
                hosts.add(self.owner[i])
                answering[self.owner[i]] |= i in self.gathering
            for host in sorted(hosts):
                routed[host].append(sent)
        # To a host none of whose addressees gathers the frames are only queued: posted.
        self.hosts.post("deliver", [(part,) if part and not answering[h] else None for h, part in enumerate(routed)])
        self._sent(self.hosts.call("deliver", [(part,) if answering[h] else None for h, part in enumerate(routed)]))

    def _sent(self, answers: list[list[Sent] | None]) -> None:
        for sent in (sent for part in answers if part for sent in part):
            self.queue.push(self.now + self.latency_s, ARRIVAL, sent.sender, sent)
        self._close_at(self.now)

    def _close(self) -> list[RoundRecord]:
        """The gathers the rule ends now: their nodes' records. Each such round ends when its end
        of round has passed (a BEGIN event): then the node chooses its next round, or stops."""
        self._closing.discard(self.now)
        ends: list[dict[int, float]] = [{} for _ in self.hosts.blocks]
        for i in self.gathering:
            ends[self.owner[i]][i] = self.end_s[i]
        args = [(self.now, part) if part else None for part in ends]
        closed: list[Closed] = [part for part in self.hosts.call("close", args) if part is not None]
        records = sorted((record for part in closed for record in part.records), key=lambda r: self._index(r.node))
        for i in (self._index(record.node) for record in records):
            self.gathering.discard(i)
            self.queue.push(self.now + self.end_s[i], BEGIN, i, i)
        for part in closed:
            for wake in part.wakes.values():
                self._close_at(wake)
            for sent in part.sent:  # answers owed for what came by the close (none where arrivals are taken at once)
                self.queue.push(self.now + self.latency_s, ARRIVAL, sent.sender, sent)
        return records

    def _advance(self, nodes: list[int]) -> None:
        """The rounds of `nodes` end now: those with rounds left begin the next, the others stop."""
        parts: list[list[int]] = [[] for _ in self.hosts.blocks]
        for i in nodes:
            parts[self.owner[i]].append(i)
        answers = self.hosts.call("advance", [(part,) if part else None for part in parts])
        going_on = [i for part in answers if part for i in part]
        self.running -= set(nodes) - set(going_on)
        self._begin(going_on)

    def _close_at(self, time: float) -> None:
        if time not in self._closing:
            self._closing.add(time)
            self.queue.push(time, CLOSE, -1, None)

    def _index(self, node_id: str) -> int:
        return self.position[node_id]


class Exchange:
    """Every node of a run in this process, one shard, by default at equal speed and no latency
    (so in lock-step): the inline engine, for whoever holds the nodes already (tests, a notebook).
    `step_s` (a step cost per node, simulated seconds), `latency_s` and `schedule` set otherwise."""

    def __init__(
        self,
        nodes: Sequence[Algorithm],
        identities: Sequence[Identity],
        sender_limits: dict[int, Limits] | None = None,
        rounds: int = 1_000_000,
        *,
        step_s: Sequence[float] | None = None,
        latency_s: float = 0.0,
        schedule: Schedule | None = None,
    ) -> None:
        """`sender_limits`: node index → the limits its encoder signs with (default: the real ones)."""
        if len(nodes) != len(identities):
            raise ValueError(f"{len(nodes)} nodes but identities of {len(identities)}")
        self.ids = [identity.node_id for identity in identities]
        self.shard = Shard(
            dict(enumerate(nodes)), dict(enumerate(identities)), self.ids, sender_limits, schedule, rounds
        )
        self.hosts = InlineHosts([self.shard])
        rule = GatherRule.of(AlgorithmSettings())
        costs = [1.0] * len(self.ids) if step_s is None else list(step_s)
        self.timeline = Timeline(self.hosts, self.ids, costs, latency_s, rule)
        self._rounds = self.timeline.run()

    @property
    def nodes(self) -> list[Algorithm]:
        return list(self.shard.nodes.values())

    @property
    def rejections(self) -> dict[str, int]:
        return self.shard.rejected()

    def run_round(self, round: int) -> list[RoundRecord]:
        """Every node's round `round` (the next one: they run in order); their records, in node order."""
        records = next(self._rounds)
        if {record.round for record in records} != {round} or len(records) != len(self.ids):
            raise RuntimeError(f"round {round} asked, rounds {sorted({r.round for r in records})} ran")
        return records
