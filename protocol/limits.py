"""Hard bounds applied to every frame, before anything is allocated for it.

One `Limits` object is shared by the encoder and the decoder, so a node never produces a frame
that a peer with the same limits would refuse. The transport sets ZMQ_MAXMSGSIZE to
`max_frame_bytes`; the per-type bounds then let a 40 MB model and a 5 KB prototype set travel
on the same socket without giving a HELLO the room of a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .kinds import MessageType

__all__ = ["Limits", "DEFAULT_LIMITS", "KiB", "MiB"]

KiB = 1024
MiB = 1024 * KiB

_DEFAULT_FRAME_BYTES_BY_TYPE: Mapping[MessageType, int] = MappingProxyType(
    {
        MessageType.HELLO: 4 * KiB,
        MessageType.PEERS: 320 * KiB,  # up to 64 relayed HELLO frames
        MessageType.PING: 1 * KiB,
        MessageType.PONG: 1 * KiB,
        MessageType.BYE: 1 * KiB,
        MessageType.PROTOTYPES: 4 * MiB,
        MessageType.HEAD: 4 * MiB,
        MessageType.SCORE: 1 * KiB,
        MessageType.MODEL: 64 * MiB,
        MessageType.PASS: 1 * KiB,
        MessageType.DIAL_ME: 1 * KiB,
        MessageType.DIALED: 1 * KiB,
        MessageType.ASK: 2 * MiB,  # up to 64 images, each a PNG of the asker's input size
        MessageType.ANSWER: 16 * KiB,
        MessageType.RESERVE: 1 * KiB,
        MessageType.RESERVED: 1 * KiB,
        # A relayed frame rides sealed in these two, with room for their own envelope: a relay
        # forwards prototypes, heads and small models, not a 40 MB backbone (docs/protocol.md §5).
        MessageType.RELAY: 4 * MiB + 1 * KiB,
        MessageType.RELAYED: 4 * MiB + 1 * KiB,
        MessageType.UNRELAYED: 1 * KiB,
        MessageType.REVERSE: 5 * KiB,  # a HELLO frame inside
        MessageType.REACH: 2 * KiB,
    }
)


@dataclass(frozen=True)
class Limits:
    """Size and content bounds; every one is explicit and configurable."""

    max_frame_bytes: int = 64 * MiB
    frame_bytes_by_type: Mapping[MessageType, int] = field(default_factory=lambda: _DEFAULT_FRAME_BYTES_BY_TYPE)
    # msgpack container bounds, enforced by the unpacker before it allocates.
    max_str_len: int = 1024
    max_array_len: int = 4096
    max_map_len: int = 4096
    # Tensor bounds.
    max_tensor_rank: int = 8
    max_tensor_elements: int = 16 * 1024 * 1024
    max_tensor_norm: float = 1e6  # L2 norm of one tensor; math.inf disables the bound

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_str_len",
            "max_array_len",
            "max_map_len",
            "max_tensor_rank",
            "max_tensor_elements",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if not (isinstance(self.max_tensor_norm, (int, float)) and self.max_tensor_norm > 0) or (
            math.isnan(self.max_tensor_norm)
        ):
            raise ValueError(f"Limits.max_tensor_norm must be > 0, got {self.max_tensor_norm!r}")
        by_type = {}
        for key, value in self.frame_bytes_by_type.items():
            kind = MessageType(key)  # accepts "HELLO" as well as MessageType.HELLO
            if type(value) is not int or value <= 0:
                raise ValueError(f"Limits.frame_bytes_by_type[{kind.value}] must be a positive integer")
            by_type[kind] = value
        object.__setattr__(self, "frame_bytes_by_type", MappingProxyType(by_type))

    def max_frame_bytes_for(self, kind: MessageType) -> int:
        """The size bound for one message type; never above the global bound."""
        return min(self.frame_bytes_by_type.get(kind, self.max_frame_bytes), self.max_frame_bytes)


DEFAULT_LIMITS = Limits()
