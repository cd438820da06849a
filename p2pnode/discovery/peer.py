"""A peer: what this node knows of one node in its active view."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import Envelope, Hello, node_id
from protocol.messages import is_client_address

from .actions import Action, DialPeers

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)


@dataclass
class Peer:
    key: bytes
    address: str  # where it answered this node's challenge
    capabilities: tuple[str, ...]
    dataset_size: int
    hello: bytes  # its latest signed HELLO frame, relayed verbatim in PEERS if it names `address`
    hello_timestamp_us: int
    admitted_at: float
    last_seen: float
    subnet: str | None  # of `address`; None where subnet limits do not apply
    rtt_s: float | None = None
    last_hello_at: float = float("-inf")  # when this node last re-sent its HELLO to it
    admitted_us: bool = False  # it admitted us: we answered its challenge, before anything else we send it
    hello_address: str = ""  # the address its latest HELLO names
    peer_port: int | None = None  # its peers' socket, on the host of `address` (HELLO.peer_port)
    hello_envelope: Envelope | None = None  # `hello`, decoded: what the passive view keeps of it
    # Peers it has, at least, as its latest PEERS showed (the relayable ones, up to 63): a full
    # node makes room for a newcomer only by dropping a peer that keeps its target without us.
    reported_peers: int = 0

    @classmethod
    def admitted(cls, hello: Envelope, frame: bytes, *, address: str, subnet: str | None, now: float) -> Peer:
        """The node of the signed `hello`, admitted at `address`, where it answered our challenge."""
        body: Hello = hello.body
        return cls(
            key=hello.sender,
            address=address,
            capabilities=body.capabilities,
            dataset_size=body.dataset_size,
            hello=frame,
            hello_timestamp_us=hello.timestamp_us,
            hello_address=body.address,
            peer_port=body.peer_port,
            hello_envelope=hello,
            admitted_at=now,
            last_seen=now,
            subnet=subnet,
        )

    @property
    def peers_address(self) -> str | None:
        """Where its peers' socket is: the port it announced, on the host it was verified at."""
        if self.peer_port is None:
            return None
        return f"{self.address.rsplit(':', 1)[0]}:{self.peer_port}"

    @property
    def node_id(self) -> str:
        return node_id(self.key)

    @property
    def relayable(self) -> bool:
        """Its HELLO names the address it was verified at, one others can dial (not a client
        node's, which only the nodes it dials reach): others may be told of it."""
        return self.hello_address == self.address and not is_client_address(self.address)

    def update(self, hello: Envelope, frame: bytes) -> list[Action]:
        """A newer signed HELLO of this peer: new capabilities and peers' port (dialled anew: it
        may have restarted on another one); the address stays the verified one."""
        if hello.timestamp_us < self.hello_timestamp_us:
            return []
        body: Hello = hello.body
        self.capabilities, self.dataset_size = body.capabilities, body.dataset_size
        self.hello, self.hello_timestamp_us, self.hello_address = frame, hello.timestamp_us, body.address
        self.hello_envelope = hello
        if body.peer_port == self.peer_port:
            return []
        self.peer_port = body.peer_port
        return [] if self.peers_address is None else [DialPeers(self.address, self.peers_address)]
