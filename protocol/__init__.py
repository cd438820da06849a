"""p2pnode wire protocol: typed, signed msgpack frames. Sans-IO: bytes in, typed messages out.

This package performs no I/O, reads no clock and imports neither torch, trio nor zmq; the
daemon (p2pnode/) owns sockets and time and passes both in. The format is specified in
docs/protocol.md.
"""

from .envelope import (
    DOMAIN_TAG,
    HEADER_MAX_BYTES,
    PROTOCOL_VERSION,
    SIGNATURE_SIZE,
    Decoder,
    Encoder,
    Envelope,
    Header,
    check_network_id,
    seal_raw,
)
from .errors import ProtocolError, Reason
from .identity import NODE_ID_LENGTH, Identity, node_id
from .kinds import UNEXPECTED_TYPE
from .limits import DEFAULT_LIMITS, KiB, Limits, MiB
from .messages import (
    BODY_TYPES,
    DISCOVERY_TYPES,
    LEARNING_TYPES,
    MAX_ASKED_IMAGES,
    MAX_RELAYED_HELLOS,
    PUBLIC_KEY_SIZE,
    QUERY_TYPES,
    Answer,
    Ask,
    Body,
    Bye,
    Dialed,
    DialMe,
    Head,
    Hello,
    MessageType,
    Model,
    Pass,
    Peers,
    Ping,
    Pong,
    Prototypes,
    Score,
)
from .replay import ReplayGuard, SequenceCounter, SequenceExhausted

__all__ = [
    "BODY_TYPES",
    "DEFAULT_LIMITS",
    "DISCOVERY_TYPES",
    "DOMAIN_TAG",
    "HEADER_MAX_BYTES",
    "MAX_RELAYED_HELLOS",
    "MAX_ASKED_IMAGES",
    "QUERY_TYPES",
    "Ask",
    "Answer",
    "Pass",
    "NODE_ID_LENGTH",
    "PROTOCOL_VERSION",
    "PUBLIC_KEY_SIZE",
    "SIGNATURE_SIZE",
    "Body",
    "Bye",
    "Dialed",
    "DialMe",
    "Decoder",
    "Encoder",
    "Envelope",
    "Head",
    "Header",
    "Hello",
    "Identity",
    "KiB",
    "LEARNING_TYPES",
    "UNEXPECTED_TYPE",
    "Limits",
    "MessageType",
    "MiB",
    "Model",
    "Peers",
    "Ping",
    "Pong",
    "ProtocolError",
    "Prototypes",
    "Reason",
    "ReplayGuard",
    "Score",
    "SequenceCounter",
    "SequenceExhausted",
    "check_network_id",
    "node_id",
    "seal_raw",
]
