"""The one error type of the wire protocol.

Every way a frame can be refused maps to exactly one `Reason`, so the daemon can count
rejections by reason without parsing messages. `ProtocolError` is the only exception that
`decode_frame` and friends raise for bad input; anything else escaping is a bug.
"""

from __future__ import annotations

import enum

__all__ = ["Reason", "ProtocolError"]


class Reason(enum.StrEnum):
    """Machine-readable rejection reasons; the values are stable and appear in metrics."""

    TOO_LARGE = "too_large"  # frame over the global or per-type size limit
    MALFORMED = "malformed"  # not a p2pnode frame, bad msgpack, wrong field set or field type
    UNSUPPORTED_VERSION = "unsupported_version"  # envelope version this node does not speak
    WRONG_NETWORK = "wrong_network"  # frame for another network id
    UNKNOWN_TYPE = "unknown_type"  # message type this node does not know
    NOT_ALLOWED = "not_allowed"  # sender not on the allowlist
    BAD_SIGNATURE = "bad_signature"  # Ed25519 signature does not verify
    BAD_TENSOR = "bad_tensor"  # dtype, shape, length, NaN/Inf or norm bound
    REPLAY = "replay"  # sequence number already seen or below the window
    STALE = "stale"  # timestamp outside the allowed clock skew
    BAD_SEAL = "bad_seal"  # a relayed frame that does not open for the receiver from its claimed origin

    def __str__(self) -> str:
        return self.value


class ProtocolError(Exception):
    """A frame or message was refused. `reason` is for counters, `detail` for humans."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self):  # keep the reason when the error crosses a thread or process boundary
        return (type(self), (self.reason, self.detail))
