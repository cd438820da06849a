"""The simulator's network: a perfect synchronous exchange of real signed frames between the
hosts that own a run's nodes.

Each round every node steps and publishes; every payload is encoded and signed exactly as the
daemon would put it on the wire, decoded by the protocol decoder, and handed to its addressees
before anyone's graph step; then answers (SCooL's scores), and answers to those, until nobody
owes anything. So the traffic counted is real frame bytes, and a payload an algorithm could not
send over the network fails here first. Each node-round yields the same `RoundRecord` the
daemon's round driver writes, so one report builder serves both.

Who owns which nodes is apart from who routes frames: a host (testnet/shard.py) owns a shard of
the nodes and answers per-round commands; `exchange_round` routes frames between hosts and does
not care where they run (in this process, in worker processes, on Ray: testnet/engines.py).
Frames reach each node in the order of their senders' indices, whatever host answered first, so
a node sees exactly what it would see with every node in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from algorithms.seam import Algorithm
from p2pnode.rounds import RoundRecord
from protocol import Identity, Limits

from .shard import NETWORK, Sent, Shard, simulation_identity

__all__ = ["Exchange", "Hosts", "InlineHosts", "exchange_round", "simulation_identity", "NETWORK", "MAX_ANSWER_PASSES"]

MAX_ANSWER_PASSES = 4  # answers to answers to ...: a bound, so a faulty algorithm cannot loop


class Hosts(Protocol):
    """The hosts of a run, wherever they are: `blocks[h]` are the node indices host h owns, and
    `call` runs one shard command on every host at once, returning their answers in host order."""

    blocks: Sequence[tuple[int, ...]]

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]: ...


class InlineHosts:
    """Shards in this process, called one after the other."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        self.shards = list(shards)
        self.blocks = [tuple(shard.nodes) for shard in self.shards]

    def call(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        return [getattr(shard, method)(*arguments) for shard, arguments in zip(self.shards, args, strict=True)]


def exchange_round(hosts: Hosts, ids: Sequence[str], round: int) -> list[RoundRecord]:
    """Round `round` of every node; returns their records, in node order."""
    count = len(hosts.blocks)
    owner = {ids[i]: host for host, block in enumerate(hosts.blocks) for i in block}
    frames = _joined(hosts.call("step", [(round,)] * count))
    for passes in range(MAX_ANSWER_PASSES + 2):
        if not frames:
            break
        if passes > MAX_ANSWER_PASSES:
            raise RuntimeError(f"still answering after {MAX_ANSWER_PASSES} passes in round {round}")
        routed: list[list[Sent]] = [[] for _ in range(count)]
        for sent in sorted(frames, key=lambda sent: sent.sender):  # stable: a sender's frames keep their order
            for host in sorted({owner[peer] for peer in sent.to}):
                routed[host].append(sent)
        # Every host answers every pass, frames or not, as every node is asked for answers.
        frames = _joined(hosts.call("deliver", [(round, part) for part in routed]))
    position = {node_id: i for i, node_id in enumerate(ids)}
    return sorted(_joined(hosts.call("finish", [(round,)] * count)), key=lambda r: position[r.node])


def _joined(parts: list[list[Any]]) -> list[Any]:
    return [item for part in parts for item in part]


class Exchange:
    """Every node of a run in this process, one shard, routed in place: the inline engine, for
    whoever holds the nodes already (tests, a notebook)."""

    def __init__(
        self,
        nodes: Sequence[Algorithm],
        identities: Sequence[Identity],
        sender_limits: dict[int, Limits] | None = None,
    ) -> None:
        """`sender_limits`: node index → the limits its encoder signs with (default: the real ones)."""
        if len(nodes) != len(identities):
            raise ValueError(f"{len(nodes)} nodes but {len(identities)} identities")
        self.ids = [identity.node_id for identity in identities]
        self.shard = Shard(dict(enumerate(nodes)), dict(enumerate(identities)), self.ids, sender_limits)
        self.hosts = InlineHosts([self.shard])

    @property
    def nodes(self) -> list[Algorithm]:
        return list(self.shard.nodes.values())

    @property
    def rejections(self) -> dict[str, int]:
        return self.shard.rejected()

    def run_round(self, round: int) -> list[RoundRecord]:
        """Every node's round `round`; returns their records, in node order."""
        return exchange_round(self.hosts, self.ids, round)
