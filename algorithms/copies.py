"""Payloads passed off as one's own: a peer that sends, under its own signature, prototypes it
received from another node (or from this one) instead of its own.

A copy passes every other check (its form, scale and direction are an honest node's), and it
would make its sender look like whomever it copies: the copied node's cluster-mate, or this
node's own twin. Honest nodes never send the same bytes: each trains its prototypes on its own
data after it mixes them. So the first node seen sending a content (this node's own included)
is its author, and another sending it is refused (`copied_payload`), which distrusts it like
any refused content (algorithms/outliers.py). A digest per content, for the latest
`remember` contents.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .interface import PayloadRejected

__all__ = ["COPIED_PAYLOAD", "Authors"]

COPIED_PAYLOAD = "copied_payload"


class Authors:
    """Who sent each content first, for the latest `remember` contents."""

    def __init__(self, remember: int = 4096) -> None:
        self.remember = remember
        self._first: dict[bytes, str] = {}

    @staticmethod
    def digest(array: np.ndarray) -> bytes:
        contiguous = np.ascontiguousarray(array)
        return hashlib.blake2b(
            str((contiguous.dtype.str, contiguous.shape)).encode() + contiguous.tobytes(), digest_size=16
        ).digest()

    def authored(self, node: str, array: np.ndarray) -> None:
        """`node` sent `array` (this node publishing its own, or a peer's that passed)."""
        digest = self.digest(array)
        if digest not in self._first:
            self._first[digest] = node
            while len(self._first) > self.remember:
                del self._first[next(iter(self._first))]

    def check(self, peer: str, array: np.ndarray) -> None:
        """Raise PayloadRejected if another node sent `array` first; otherwise `peer` authored it."""
        first = self._first.get(self.digest(array))
        if first is not None and first != peer:
            raise PayloadRejected(COPIED_PAYLOAD, f"the same bytes as {first[:16]} sent first")
        self.authored(peer, array)
