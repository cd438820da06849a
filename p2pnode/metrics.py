"""Counters the node keeps about its traffic, shown by `p2pnode status`; and `SentTraffic`, the
one count of frames sent, kept by the daemon (`Metrics`) and by each simulated node
(testnet/simulation/shard.py) alike, which every round's record copies (p2pnode/learning/engine.py)."""

from __future__ import annotations

from collections import Counter

from protocol import DISCOVERY_TYPES, LEARNING_TYPES, MessageType

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = [
    "Metrics",
    "SentTraffic",
    "RATE_LIMITED",
    "STRANGER_RATE_LIMITED",
    "HANDSHAKE_FIRST",
    "WRONG_SENDER",
    "UNKNOWN_PEER",
    "MULTIPART",
    "NOT_LEARNING",
    "NOT_RELAY",
    "RESERVED_UNEXPECTED",
]

# Refusals decided by the daemon rather than by protocol/ (those use protocol.Reason values).
RATE_LIMITED = "rate_limited"  # over the per-connection inbound rate of a peer's link
STRANGER_RATE_LIMITED = "stranger_rate_limited"  # over the strangers' rate (node-wide or per subnet)
HANDSHAKE_FIRST = "handshake_first"  # not a handshake frame, on a connection no admitted peer proved
WRONG_SENDER = "wrong_sender"  # claims another key than the one its connection is bound to
UNKNOWN_PEER = "unknown_peer"  # a message that needs an admitted peer, from a sender that is not one
MULTIPART = "malformed"  # a multipart ZeroMQ message: not a p2pnode frame
NOT_LEARNING = "not_learning"  # a learning payload for a node that runs no algorithm (yet)
NOT_RELAY = "not_relay"  # a relaying frame (protocol RELAY_TYPES) this node does not take (yet, or as configured)
RESERVED_UNEXPECTED = "reserved_unexpected"  # RESERVED from a peer this node asked nothing (relay/service.py)


class SentTraffic:
    """Frames sent, by type: messages (one per addressee), their bytes, and the tensor bytes
    inside them."""

    def __init__(self) -> None:
        self.messages: Counter[MessageType] = Counter()
        self.bytes: Counter[MessageType] = Counter()
        self.payload_bytes: Counter[MessageType] = Counter()

    def count(self, kind: MessageType, size: int, payload: int = 0, copies: int = 1) -> None:
        """One frame of `size` bytes (`payload` of them tensors) sent to `copies` addressees."""
        self.messages[kind] += copies
        self.bytes[kind] += size * copies
        self.payload_bytes[kind] += payload * copies

    def of(self, family: frozenset[MessageType]) -> dict[MessageType, tuple[int, int, int]]:
        """The counts of the types in `family`, by type: (messages, bytes, payload bytes)."""
        return {
            kind: (self.messages[kind], self.bytes[kind], self.payload_bytes[kind])
            for kind in sorted(self.messages)
            if kind in family
        }


class Metrics:
    def __init__(self) -> None:
        self.messages_in: Counter[MessageType] = Counter()
        self.bytes_in: Counter[MessageType] = Counter()
        self.out = SentTraffic()
        self.messages_out, self.bytes_out = self.out.messages, self.out.bytes
        self.rejections: Counter[str] = Counter()
        self.rejected_bytes = 0
        self.send_dropped: Counter[MessageType] = Counter()  # peer queue full or not connected
        self.send_refused: Counter[MessageType] = Counter()  # not signed: no sequence number reserved
        self.state_write_failures = 0  # the sequence reservation could not be saved (a full disk)
        self.beacon_sends_failed = 0
        self.connections: Counter[str] = Counter()  # inbound connections: events, ZAP verdicts (zap.py)
        self.payload_bytes_out = self.out.payload_bytes  # tensor bytes inside the frames sent
        # Connections to the Prometheus endpoint closed unanswered, by reason (prometheus.py).
        self.metrics_connections_closed: Counter[str] = Counter()

    def received(self, kind: MessageType, size: int) -> None:
        self.messages_in[kind] += 1
        self.bytes_in[kind] += size

    def sent(self, kind: MessageType, size: int, payload: int = 0) -> None:
        self.out.count(kind, size, payload)

    def learning_sent(self) -> dict[MessageType, tuple[int, int, int]]:
        """Learning frames sent so far, by type: (messages, bytes, payload bytes)."""
        return self.out.of(LEARNING_TYPES)

    def discovery_sent(self) -> dict[MessageType, tuple[int, int, int]]:
        """Discovery and keep-alive frames sent so far, by type, shaped as `learning_sent`."""
        return self.out.of(DISCOVERY_TYPES)

    def inbound_bytes(self) -> int:
        """Bytes of every frame taken in so far, accepted or refused."""
        return sum(self.bytes_in.values()) + self.rejected_bytes

    def rejected(self, reason: str, size: int) -> None:
        self.rejections[reason] += 1
        self.rejected_bytes += size

    def snapshot(self) -> dict:
        kinds = sorted(set(self.messages_in) | set(self.messages_out))
        return {
            "messages_in": sum(self.messages_in.values()),
            "bytes_in": sum(self.bytes_in.values()),
            "messages_out": sum(self.messages_out.values()),
            "bytes_out": sum(self.bytes_out.values()),
            "by_type": {
                kind: {
                    "messages_in": self.messages_in[kind],
                    "bytes_in": self.bytes_in[kind],
                    "messages_out": self.messages_out[kind],
                    "bytes_out": self.bytes_out[kind],
                    "payload_bytes_out": self.payload_bytes_out[kind],
                }
                for kind in kinds
            },
            "rejections": dict(sorted(self.rejections.items())),
            "rejected_bytes": self.rejected_bytes,
            "send_dropped": dict(sorted(self.send_dropped.items())),
            "send_refused": dict(sorted(self.send_refused.items())),
            "beacon_sends_failed": self.beacon_sends_failed,
            "connections": dict(sorted(self.connections.items())),
            "metrics_connections_closed": dict(sorted(self.metrics_connections_closed.items())),
        }
