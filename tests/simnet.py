"""An in-memory network for `Membership`: real identities, real signed frames, real decoding
and replay checks, simulated time and links. Discovery logic runs exactly as in the daemon
(the same `Membership.on_message`), without sockets or waiting."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from dataclasses import dataclass, replace

import networkx as nx

from p2pnode.discovery.actions import Admitted, Dial, Evicted, Hangup, Send, SendHello
from p2pnode.discovery.peers import Membership
from p2pnode.discovery.settings import DiscoverySettings
from p2pnode.wire.inbound.reader import decode_all
from protocol import PROTOCOL_VERSION, Decoder, Encoder, Envelope, Hello, MessageType, ProtocolError, ReplayGuard
from protocol.messages import CLIENT_CAPABILITY, client_address

from .conftest import fixed_identity

NETWORK = "sim"
# Simulated nodes sit at 10.0.0.x, one subnet: lift its limits unless a test sets them.
_UNLIMITED_SUBNETS = {"max_peers_per_subnet": 4096, "dialing_per_subnet": 4096}
EPOCH_US = 1_700_000_000_000_000
TICK = 0.05
_REMEMBERED = 20_000  # decoded frames a SimNet keeps


class _RememberingDecoder(Decoder):
    """The protocol's decoder, remembering what it decoded: `decode` is a pure function of the
    bytes (the replay checks are each node's own `ReplayGuard`), and in a simulated network every
    relayed HELLO is verified again by each of the many nodes it reaches, which made Ed25519
    verification half of a 30-node run's time. Frames that fail are decoded (and fail) anew."""

    def __init__(self, network: str) -> None:
        super().__init__(network)
        self._decoded: dict[bytes, Envelope] = {}

    def decode(self, frame: bytes) -> Envelope:
        envelope = self._decoded.get(frame)
        if envelope is None:
            if len(self._decoded) >= _REMEMBERED:
                self._decoded.clear()  # a bound on memory in long runs; it costs only a re-verify
            envelope = self._decoded[frame] = super().decode(frame)
        return envelope


@dataclass
class SimNode:
    index: int
    address: str
    membership: Membership
    encoder: Encoder
    seq: itertools.count
    connections: set  # addresses with an open outbound connection
    guard: ReplayGuard
    up: bool = True
    host: str | None = None  # where its connections come from, as a receiver sees it (`client_host`)

    @property
    def key(self) -> bytes:
        return self.encoder.identity.public_key


class SimNet:
    def __init__(self, latency: float = 0.002, connect_delay: float = 0.01) -> None:
        self.now = 0.0
        self.latency, self.connect_delay = latency, connect_delay
        self.nodes: dict[str, SimNode] = {}
        self.decoder = _RememberingDecoder(NETWORK)
        self._queue: list = []
        self._order = itertools.count()
        self._connected_at: dict[tuple[str, str], float] = {}
        self.delivered = 0
        self.refusals: Counter[str] = Counter()  # what Membership refused, by reason

    def now_us(self) -> int:
        return EPOCH_US + int(self.now * 1e6)

    def add(
        self,
        index: int,
        bootstrap: list[str] = (),
        seed_identity: int | None = None,
        address: str | None = None,
        client_host: str | None = None,
        **settings,
    ) -> SimNode:
        """A node at `address` (default 10.0.0.`index`); with `client_host`, a client node
        (docs/daemon.md, "Client mode") whose connections come from that host."""
        identity = fixed_identity(100 + (index if seed_identity is None else seed_identity))
        address = client_address(identity.public_key) if client_host else address or f"tcp://10.0.0.{index}:7000"
        config = replace(DiscoverySettings(), bootstrap=tuple(bootstrap), **{**_UNLIMITED_SUBNETS, **settings})
        node = SimNode(
            index,
            address,
            Membership(identity.public_key, config, rng=random.Random(index), now=self.now),
            Encoder(identity, NETWORK),
            itertools.count(self.now_us()),
            set(),
            ReplayGuard(),
            host=client_host,
        )
        node.membership.set_own_hello(self.frame(node, self._hello(node)))
        self.nodes[address] = node
        return node

    def _hello(self, node: SimNode) -> Hello:
        capabilities = (CLIENT_CAPABILITY,) if node.host else ()
        return Hello(
            address=node.address, capabilities=capabilities, dataset_size=0, protocol_versions=(PROTOCOL_VERSION,)
        )

    def frame(self, node: SimNode, body) -> bytes:
        """`body` signed by `node`, as it would send it now."""
        return node.encoder.encode(body, seq=next(node.seq), timestamp_us=self.now_us(), round=0)

    def inject(self, node: SimNode, frame: bytes) -> None:
        """Deliver `frame` to `node` now, as if a stranger had sent it there."""
        heapq.heappush(self._queue, (self.now, next(self._order), node.address, frame, None))

    def kill(self, node: SimNode) -> None:
        """Like kill -9: no BYE, its connections just stop answering."""
        node.up = False

    def _send(self, node: SimNode, address: str, frame: bytes) -> bool:
        target = self.nodes.get(address)
        connected = address in node.connections and self.now >= self._connected_at.get((node.address, address), 0)
        if not connected or target is None or not target.up:
            return False
        heapq.heappush(self._queue, (self.now + self.latency, next(self._order), address, frame, node.host))
        return True

    def execute(self, node: SimNode, actions) -> None:
        for action in actions:
            if isinstance(action, Dial):
                if action.address not in node.connections:
                    node.connections.add(action.address)
                    self._connected_at[(node.address, action.address)] = self.now + self.connect_delay
            elif isinstance(action, Admitted):
                node.guard.trust(action.key, action.seq)
            elif isinstance(action, Evicted):
                node.guard.forget(action.key)
            elif isinstance(action, Hangup):
                node.connections.discard(action.address)
            elif isinstance(action, SendHello):
                ok = self._send(node, action.address, self.frame(node, self._hello(node)))
                self.execute(node, node.membership.hello_sent(action.address, ok, self.now))
            elif isinstance(action, Send):
                frame = self.frame(node, action.body)
                for address in action.addresses:
                    self._send(node, address, frame)

    def _deliver(self, address: str, frame: bytes, source: str | None = None) -> None:
        node = self.nodes[address]
        if not node.up:
            return
        envelope = self.decoder.decode(frame)
        node.guard.admit(envelope.sender, envelope.seq, envelope.timestamp_us, self.now_us())
        relayed = []
        if envelope.type is MessageType.PEERS:
            for hello, raw in zip(
                decode_all(self.decoder, list(envelope.body.hellos)), envelope.body.hellos, strict=True
            ):
                if not isinstance(hello, ProtocolError) and hello.type is MessageType.HELLO:
                    relayed.append((hello, raw))
        actions, refusal = node.membership.on_message(envelope, frame, self.now, self.now_us(), relayed, source=source)
        if refusal is not None:
            self.refusals[refusal] += 1
        self.delivered += 1
        self.execute(node, actions)

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        next_tick = self.now
        while self.now < end:
            if self._queue and self._queue[0][0] <= next_tick:
                self.now, _, address, frame, source = heapq.heappop(self._queue)
                self._deliver(address, frame, source)
            else:
                self.now = next_tick
                for node in list(self.nodes.values()):
                    if node.up:
                        self.execute(node, node.membership.tick(self.now))
                next_tick += TICK

    def run_until(self, condition, timeout: float) -> float:
        start = self.now
        while not condition():
            if self.now - start > timeout:
                raise AssertionError(f"condition not reached within {timeout} simulated seconds")
            self.run(TICK)
        return self.now - start

    def full_mesh(self) -> bool:
        up = [n for n in self.nodes.values() if n.up]
        return all(set(n.membership.peers) == {m.key for m in up if m is not n} for n in up)


def address(i: int) -> str:
    """Node `i`'s address in the overlay tests: one /24 for every 250 nodes."""
    return f"tcp://10.0.{i // 250}.{i % 250}:7000"


def overlay(nodes: list[SimNode]) -> nx.Graph:
    """Who is whose peer, among the nodes that are up."""
    graph = nx.Graph()
    graph.add_nodes_from(node.key for node in nodes if node.up)
    graph.add_edges_from((node.key, key) for node in nodes if node.up for key in node.membership.peers)
    return graph
