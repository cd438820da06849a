"""The message types of the protocol, in their four families.

Kept apart from the bodies (messages.py) so that limits, which are set per type, need not import
the bodies.
"""

from __future__ import annotations

import enum

__all__ = ["MessageType", "DISCOVERY_TYPES", "QUERY_TYPES", "RELAY_TYPES", "LEARNING_TYPES", "UNEXPECTED_TYPE"]


class MessageType(enum.StrEnum):
    """Every message type. Four families: discovery (who is out there and alive: the daemon's
    own business), queries (`predict --ask-peers`: a user's images and a peer's answer about
    them, outside the rounds), relaying (nodes behind NATs reached through a public node that
    forwards sealed frames it cannot read) and learning (an algorithm's payloads, handed to its
    round driver)."""

    HELLO = "HELLO"
    PEERS = "PEERS"
    PING = "PING"
    PONG = "PONG"
    BYE = "BYE"
    DIAL_ME = "DIAL_ME"
    DIALED = "DIALED"
    PROTOTYPES = "PROTOTYPES"
    HEAD = "HEAD"
    SCORE = "SCORE"
    MODEL = "MODEL"
    PASS = "PASS"
    ASK = "ASK"
    ANSWER = "ANSWER"
    RESERVE = "RESERVE"
    RESERVED = "RESERVED"
    RELAY = "RELAY"
    RELAYED = "RELAYED"
    UNRELAYED = "UNRELAYED"
    REVERSE = "REVERSE"
    REACH = "REACH"

    @property
    def is_learning(self) -> bool:
        return self in LEARNING_TYPES


DISCOVERY_TYPES = frozenset(
    {
        MessageType.HELLO,
        MessageType.PEERS,
        MessageType.PING,
        MessageType.PONG,
        MessageType.BYE,
        MessageType.DIAL_ME,
        MessageType.DIALED,
    }
)
QUERY_TYPES = frozenset({MessageType.ASK, MessageType.ANSWER})
RELAY_TYPES = frozenset(
    {
        MessageType.RESERVE,
        MessageType.RESERVED,
        MessageType.RELAY,
        MessageType.RELAYED,
        MessageType.UNRELAYED,
        MessageType.REVERSE,
        MessageType.REACH,
    }
)
# A new algorithm's payload type is one more member above, with its body in messages.py.
LEARNING_TYPES = frozenset(MessageType) - DISCOVERY_TYPES - QUERY_TYPES - RELAY_TYPES
# The refusal counted for a learning payload of a type the receiving algorithm never takes:
# the daemon refuses it on arrival (p2pnode/learning/rounds.py), the algorithm once more when handed one.
UNEXPECTED_TYPE = "unexpected_type"
