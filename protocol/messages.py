"""Typed message bodies for the whole system.

Each body is a frozen dataclass whose fields are declared once with `wire(codec)`; on the wire
a body is a msgpack map with exactly those keys (no key missing, none extra, none repeated).
Cross-field rules (a head's bias matches its weight, one count per prototype) live in `check`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

from .errors import ProtocolError, Reason
from .kinds import DISCOVERY_TYPES, LEARNING_TYPES, QUERY_TYPES, RELAY_TYPES, MessageType
from .schema import Blob, Choice, Codec, ListOf, Nullable, Real, Tensor, TensorMap, Text, UInt, is_array, malformed

if TYPE_CHECKING:
    import numpy as np

    from .limits import Limits

__all__ = [
    "MessageType",
    "DISCOVERY_TYPES",
    "QUERY_TYPES",
    "RELAY_TYPES",
    "LEARNING_TYPES",
    "Body",
    "Hello",
    "Peers",
    "Ping",
    "Pong",
    "Bye",
    "Dialed",
    "DialMe",
    "Prototypes",
    "Head",
    "Score",
    "Model",
    "Ask",
    "Answer",
    "Pass",
    "Reserve",
    "Reserved",
    "Relay",
    "Relayed",
    "Unrelayed",
    "Reverse",
    "Reach",
    "MAX_ASKED_IMAGES",
    "BODY_TYPES",
    "MAX_RELAYED_HELLOS",
    "PUBLIC_KEY_SIZE",
    "CLIENT_CAPABILITY",
    "RELAY_CAPABILITY",
    "RELAYED_CAPABILITY",
    "MAX_RELAYS",
    "MAX_CAPABILITIES",
    "client_address",
    "is_client_address",
]

PUBLIC_KEY_SIZE = 32  # Ed25519 raw public key


class Field(NamedTuple):
    name: str
    codec: Codec
    path: str  # "TYPE.name", where errors say the problem is


_REQUIRED: Any = dataclasses.MISSING


def wire(codec: Codec, default: Any = _REQUIRED) -> Any:
    """Declare a body field and its wire codec. A default only spares Python callers the
    argument: on the wire every field is always present (nil for an absent nullable one), so
    each body has exactly one encoding."""
    return dataclasses.field(default=default, metadata={"wire": codec})


class Body:
    """Base of all message bodies: wire conversion, field-wise equality, compact repr."""

    TYPE: ClassVar[MessageType]
    FIELDS: ClassVar[tuple[Field, ...]]
    _KEYS: ClassVar[frozenset[str]]

    def check(self, limits: Limits) -> None:
        """Rules that span several fields; raise ProtocolError. Runs on encode and decode."""

    def to_wire(self, limits: Limits) -> dict[str, Any]:
        obj = {f.name: f.codec.encode(getattr(self, f.name), limits, f.path) for f in self.FIELDS}
        self.check(limits)
        return obj

    @classmethod
    def from_wire(cls, obj: Any, limits: Limits) -> Body:
        name = cls.TYPE.value
        if type(obj) is not dict:
            raise malformed(name, f"body must be a map, got {type(obj).__name__}")
        if obj.keys() != cls._KEYS:
            missing = sorted(cls._KEYS - obj.keys())
            extra = sorted(map(repr, obj.keys() - cls._KEYS))
            raise malformed(name, f"missing fields {missing}, unexpected fields {extra}")
        body = cls(**{f.name: f.codec.decode(obj[f.name], limits, f.path) for f in cls.FIELDS})
        body.check(limits)
        return body

    def payload_bytes(self) -> int:
        """Bytes of tensor data and relayed frames this body carries: what signing it costs."""
        return sum(_payload_bytes(getattr(self, f.name)) for f in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]  # bodies may hold arrays

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}={_short(getattr(self, f.name))}" for f in self.FIELDS)
        return f"{type(self).__name__}({parts})"


def _payload_bytes(value: Any) -> int:
    if is_array(value):
        return value.nbytes
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(map(_payload_bytes, value.values()))
    if isinstance(value, tuple):
        return sum(map(_payload_bytes, value))
    return 0


def _same(a: Any, b: Any) -> bool:
    if is_array(a) or is_array(b):
        return is_array(a) and is_array(b) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def _short(value: Any) -> str:
    if is_array(value):
        return f"<{value.dtype.name}{list(value.shape)}>"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple) and any(isinstance(v, bytes) for v in value):
        return "(" + ", ".join(map(_short, value)) + ")"
    if isinstance(value, bytes) and len(value) > 16:
        return f"<{len(value)} bytes>"
    return repr(value)


BODY_TYPES: dict[MessageType, type[Body]] = {}
_B = TypeVar("_B", bound=type)


def body(kind: MessageType) -> Callable[[_B], _B]:
    """Make a class a registered, frozen message body of type `kind`."""

    def register(cls: _B) -> _B:
        cls = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
        cls.TYPE = kind
        cls.FIELDS = tuple(Field(f.name, f.metadata["wire"], f"{kind.value}.{f.name}") for f in dataclasses.fields(cls))
        cls._KEYS = frozenset(f.name for f in cls.FIELDS)
        BODY_TYPES[kind] = cls
        return cls

    return register


# --- field vocabulary -----------------------------------------------------------------------

TOKEN = Text(max_len=64, pattern=r"[a-z0-9][a-z0-9._:-]*")
PARAM_NAME = Text(max_len=256, pattern=r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def _port_in_range(address: str) -> str | None:
    port = int(address.rsplit(":", 1)[1])
    return None if 1 <= port <= 65535 else f"port {port} outside 1..65535"


# ZeroMQ TCP endpoint another node can connect to: host name, IPv4 or bracketed IPv6, and port.
TCP_ADDRESS = Text(
    max_len=256,
    pattern=r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):[0-9]{1,5}",
    rule=_port_in_range,
)
MAX_CLASSES = 4096
MAX_CAPABILITIES = 32  # tokens in one HELLO
MAX_RELAYED_HELLOS = 64

# A node nobody can dial (behind a NAT; docs/protocol.md §5, "Client nodes") announces this
# capability and, as its address, one derived from its key under the reserved `.invalid` domain
# (RFC 2606): it resolves nowhere, and no other key can claim it in a signed HELLO.
CLIENT_CAPABILITY = "client"
_CLIENT_DOMAIN = ".client.invalid"


# A public node that forwards for clients (`[relay].enabled`) announces RELAY_CAPABILITY; a client
# that holds reservations at relays announces RELAYED_CAPABILITY, and where it is reached in REACH.
RELAY_CAPABILITY = "relay"
RELAYED_CAPABILITY = "relayed"
MAX_RELAYS = 4  # relays one REACH names


def client_address(public_key: bytes) -> str:
    """The address a client node announces: its key's, reached only over connections it dials."""
    return f"tcp://{bytes(public_key[:16]).hex()}{_CLIENT_DOMAIN}:1"


def is_client_address(address: str) -> bool:
    return address.endswith(f"{_CLIENT_DOMAIN}:1")


MAX_ASKED_IMAGES = 64


def _hello_frame_limit(limits: Limits) -> int:
    return limits.max_frame_bytes_for(MessageType.HELLO)


# --- bodies ---------------------------------------------------------------------------------


@body(MessageType.HELLO)
class Hello(Body):
    """Who I am and where to reach me; signed, so it binds node key ↔ address ↔ capabilities."""

    address: str = wire(TCP_ADDRESS)
    capabilities: tuple[str, ...] = wire(ListOf(TOKEN, max_len=MAX_CAPABILITIES, unique=True))
    dataset_size: int = wire(UInt(64))
    protocol_versions: tuple[int, ...] = wire(ListOf(UInt(8), min_len=1, max_len=16, unique=True))
    # The port where admitted peers send frames too large for `address` (a node's public port
    # takes only small ones, so that strangers cannot make it hold large frames), on the host
    # where the sender was verified; nil: everything goes to `address`.
    peer_port: int | None = wire(Nullable(UInt(16)), None)

    def check(self, limits: Limits) -> None:
        if self.peer_port == 0:
            raise malformed("HELLO.peer_port", "port 0 cannot be dialled")


@body(MessageType.PEERS)
class Peers(Body):
    """Peer exchange: other nodes' own signed HELLO frames, relayed verbatim so the receiver can
    verify each key ↔ address binding itself instead of trusting the relay."""

    hellos: tuple[bytes, ...] = wire(
        ListOf(
            Blob(max_len=_hello_frame_limit, what="a complete signed HELLO frame, within the HELLO size bound"),
            max_len=MAX_RELAYED_HELLOS,
        )
    )


@body(MessageType.PING)
class Ping(Body):
    nonce: int = wire(UInt(64))


@body(MessageType.PONG)
class Pong(Body):
    nonce: int = wire(UInt(64))  # the PING's nonce, echoed


@body(MessageType.BYE)
class Bye(Body):
    reason: str = wire(TOKEN)


@body(MessageType.DIAL_ME)
class DialMe(Body):
    """Dial me back (AutoNAT): connect to the host this frame's connection comes from, at `port`,
    and send DIALED with `nonce` there. The receiver dials no host but that one, so nobody can aim
    it at a third party; whether the DIALED arrives tells the sender if it is reachable there."""

    nonce: int = wire(UInt(64))
    port: int = wire(UInt(16))


@body(MessageType.DIALED)
class Dialed(Body):
    """The answer to DIAL_ME, sent over a connection of its own to `address` (the asker's host as
    the sender saw it, and the port asked for), after the sender's HELLO."""

    nonce: int = wire(UInt(64))  # the DIAL_ME's, echoed
    address: str = wire(TCP_ADDRESS)


@body(MessageType.PROTOTYPES)
class Prototypes(Body):
    """Class prototypes ξ: row r is the prototype of class classes[r], from counts[r] samples.

    `head` optionally carries the sender's classifier-head weight (one row per class of its
    model) in the same frame, so an algorithm that shares both (MAPL) costs one message per
    neighbour per round, not two.
    """

    classes: tuple[int, ...] = wire(ListOf(UInt(16), max_len=MAX_CLASSES, unique=True))
    counts: tuple[int, ...] = wire(ListOf(UInt(32), max_len=MAX_CLASSES))
    prototypes: np.ndarray = wire(Tensor(rank=2))
    head: np.ndarray | None = wire(Nullable(Tensor(rank=2)), default=None)

    def check(self, limits: Limits) -> None:
        rows = self.prototypes.shape[0]
        if not rows == len(self.classes) == len(self.counts):
            raise ProtocolError(
                Reason.BAD_TENSOR,
                f"PROTOTYPES: {rows} prototype rows, {len(self.classes)} classes, {len(self.counts)} counts",
            )
        if self.head is not None and self.classes and max(self.classes) >= self.head.shape[0]:
            raise ProtocolError(
                Reason.BAD_TENSOR, f"PROTOTYPES: class {max(self.classes)} but the head has {self.head.shape[0]} rows"
            )


@body(MessageType.HEAD)
class Head(Body):
    """A linear classifier head: logits = weight @ z + bias, weight is (classes × latent)."""

    weight: np.ndarray = wire(Tensor(rank=2))
    bias: np.ndarray | None = wire(Nullable(Tensor(rank=1)))

    def check(self, limits: Limits) -> None:
        if self.bias is not None and self.bias.shape[0] != self.weight.shape[0]:
            raise ProtocolError(
                Reason.BAD_TENSOR, f"HEAD: bias has {self.bias.shape[0]} entries, weight {self.weight.shape[0]} rows"
            )


@body(MessageType.SCORE)
class Score(Body):
    """A score about another node's published payload: `value` is log P(D_me | θ_subject) for
    kind "log_likelihood" (SCooL's E-step input, over `samples` of my samples) or a similarity."""

    kind: str = wire(Choice("log_likelihood", "similarity"))
    subject: bytes = wire(Blob(size=PUBLIC_KEY_SIZE, what="public key of the node whose payload was scored"))
    subject_seq: int = wire(UInt(64))  # sequence number of the frame that carried that payload
    value: float = wire(Real())
    samples: int = wire(UInt(32))


@body(MessageType.MODEL)
class Model(Body):
    """Named parameters (or their deltas) of a homogeneous model, in state-dict order.

    `update` optionally rides with kind "params": the sender's local update in this round,
    update = params at round start − params sent, keyed like `tensors` (float tensors only; a
    key of `tensors` may be missing, e.g. an integer buffer). A receiver can then both score
    the parameters and apply the sender's update to its own model (SCooL's M-step
    θ_i ← θ_i^start − Σ_j w_ij Δ_j) from one message.
    """

    kind: str = wire(Choice("params", "delta"))
    tensors: dict[str, np.ndarray] = wire(TensorMap(PARAM_NAME, Tensor(kinds="fiub"), max_len=4096))
    update: dict[str, np.ndarray] | None = wire(
        Nullable(TensorMap(PARAM_NAME, Tensor(kinds="f"), max_len=4096)), default=None
    )

    def check(self, limits: Limits) -> None:
        if self.update is None:
            return
        if self.kind != "params":
            raise ProtocolError(Reason.BAD_TENSOR, f"MODEL: an update only rides with kind 'params', not {self.kind!r}")
        for name, delta in self.update.items():
            if name not in self.tensors:
                raise ProtocolError(Reason.BAD_TENSOR, f"MODEL: update[{name!r}] names no tensor of the model")
            if delta.shape != self.tensors[name].shape:
                raise ProtocolError(
                    Reason.BAD_TENSOR,
                    f"MODEL: update[{name!r}] has shape {delta.shape}, tensors[{name!r}] {self.tensors[name].shape}",
                )


def _ask_frame_limit(limits: Limits) -> int:
    return limits.max_frame_bytes_for(MessageType.ASK)


@body(MessageType.PASS)
class Pass(Body):
    """Nothing more from the sender for the receiver in the envelope's round: a neighbour the
    sender published to last round and no longer does (its graph cut the receiver). Without it,
    the receiver would wait its round deadline for a payload that is not coming; with it, the
    sender is settled at once (as GossipSub's PRUNE tells a peer it left the mesh)."""


@body(MessageType.ASK)
class Ask(Body):
    """A user's images, for the peer to classify with its own model (`p2pnode predict --ask-peers`):
    each a PNG of the asker's model input, pixels only. Images, not features: a peer that knows
    classes the asker does not learns apart from it, so the asker's features mean nothing to it."""

    query: int = wire(UInt(64))  # the asker's name for this question, echoed in the ANSWER
    images: tuple[bytes, ...] = wire(
        ListOf(Blob(max_len=_ask_frame_limit, what="a PNG image"), min_len=1, max_len=MAX_ASKED_IMAGES)
    )


@body(MessageType.ANSWER)
class Answer(Body):
    """What the peer's model says of each asked image, in order: its class (over the classes the
    network shares), that class's probability, and the best probability among the peer's own
    classes alone; the image is one of the peer's classes when its class is in `classes` and
    that probability is at least `threshold` (its own, set on its own held-out images).
    `refused` names why a peer answers none (then the lists are empty)."""

    query: int = wire(UInt(64))
    classes: tuple[int, ...] = wire(ListOf(UInt(16), max_len=MAX_CLASSES, unique=True))  # the peer's own
    threshold: float = wire(Real())
    labels: tuple[int, ...] = wire(ListOf(UInt(16), max_len=MAX_ASKED_IMAGES))
    probabilities: tuple[float, ...] = wire(ListOf(Real(), max_len=MAX_ASKED_IMAGES))
    own_probabilities: tuple[float, ...] = wire(ListOf(Real(), max_len=MAX_ASKED_IMAGES))
    refused: str | None = wire(Nullable(TOKEN), None)

    def check(self, limits: Limits) -> None:
        if not len(self.labels) == len(self.probabilities) == len(self.own_probabilities):
            raise malformed(
                "ANSWER",
                f"{len(self.labels)} labels, {len(self.probabilities)} probabilities, "
                f"{len(self.own_probabilities)} own probabilities",
            )
        if self.refused is not None and self.labels:
            raise malformed("ANSWER", "a refusal carries no labels")
        values = (self.threshold, *self.probabilities, *self.own_probabilities)
        if not all(0.0 <= value <= 1.0 for value in values):
            raise malformed("ANSWER", "probabilities and the threshold lie in [0, 1]")


# --- relaying (docs/protocol.md §5, "Relays") ------------------------------------------------

# What a relayed frame may take of RELAY's and RELAYED's bound: the rest is their own envelope
# (header, the other key, the map and its keys, the signature: under 400 bytes).
_RELAY_ENVELOPE_ROOM = 512
RELAY_REFUSALS = ("full", "subnet", "not_relay")
UNRELAYED_REASONS = ("no_reservation", "circuits_full", "rate", "spent", "too_large", "gone")


def _sealed_limit(limits: Limits) -> int:
    return limits.max_frame_bytes_for(MessageType.RELAY) - _RELAY_ENVELOPE_ROOM


_SEALED = Blob(max_len=_sealed_limit, what="a complete signed frame, sealed by its origin to its target")
_KEY = Blob(size=PUBLIC_KEY_SIZE, what="a node's public key")


@body(MessageType.RESERVE)
class Reserve(Body):
    """A node that cannot be dialled asks a relay, one of its admitted peers, to hold a place
    for it for `ttl_s` seconds: to forward what others send it there. 0 gives the place up."""

    ttl_s: int = wire(UInt(32))


@body(MessageType.RESERVED)
class Reserved(Body):
    """The relay's answer to RESERVE: the seconds it grants (at most those asked), or why none."""

    ttl_s: int = wire(UInt(32))
    refused: str | None = wire(Nullable(Choice(*RELAY_REFUSALS)), None)

    def check(self, limits: Limits) -> None:
        if self.refused is not None and self.ttl_s != 0:
            raise malformed("RESERVED", "a refusal grants 0 seconds")


@body(MessageType.RELAY)
class Relay(Body):
    """Forward `sealed` to `target`, a node holding a reservation at the receiver (or the node a
    circuit to the sender came from). `sealed` opens only for the target."""

    target: bytes = wire(_KEY)
    sealed: bytes = wire(_SEALED)


@body(MessageType.RELAYED)
class Relayed(Body):
    """A frame forwarded by the sender, a relay, from `origin`, sealed by the origin to the receiver."""

    origin: bytes = wire(_KEY)
    sealed: bytes = wire(_SEALED)


@body(MessageType.UNRELAYED)
class Unrelayed(Body):
    """The relay did not forward a RELAY to `target`, and why."""

    target: bytes = wire(_KEY)
    reason: str = wire(Choice(*UNRELAYED_REASONS))


@body(MessageType.REVERSE)
class Reverse(Body):
    """Connection reversal: from a public node to `target`'s relay, and from the relay to the
    target: dial the node whose signed HELLO this is. Traffic then goes directly."""

    target: bytes = wire(_KEY)
    hello: bytes = wire(Blob(max_len=_hello_frame_limit, what="a complete signed HELLO frame of the node to dial"))


@body(MessageType.REACH)
class Reach(Body):
    """Where a client node is reached: the relays holding a reservation for it (their keys and
    addresses, in the same order) until `expires_us`. Signed by the client, carried in PEERS
    beside its HELLO."""

    relay_keys: tuple[bytes, ...] = wire(ListOf(_KEY, min_len=1, max_len=MAX_RELAYS, unique=True))
    relay_addresses: tuple[str, ...] = wire(ListOf(TCP_ADDRESS, min_len=1, max_len=MAX_RELAYS))
    expires_us: int = wire(UInt(64))

    def check(self, limits: Limits) -> None:
        if len(self.relay_keys) != len(self.relay_addresses):
            raise malformed("REACH", f"{len(self.relay_keys)} relay keys, {len(self.relay_addresses)} addresses")
        if any(is_client_address(address) for address in self.relay_addresses):
            raise malformed("REACH.relay_addresses", "a client node relays for nobody")
