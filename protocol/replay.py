"""Replay protection (receiver side) and sequence numbers that never repeat (sender side).

Both are plain state machines: the caller passes the current time in, and persists what
`SequenceCounter` asks it to persist. Neither reads a clock or touches a file.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .errors import ProtocolError, Reason
from .identity import node_id

__all__ = ["ReplayGuard", "SequenceCounter", "SequenceExhausted"]

_U64_MAX = (1 << 64) - 1


@dataclass
class _SenderWindow:
    highest: int  # highest sequence number accepted so far
    seen: int  # bit k set <=> highest - k was accepted (k < window)


class ReplayGuard:
    """Refuses a frame whose timestamp is too far from the receiver's clock and, for a trusted
    sender, a frame whose (sender, seq) was accepted before.

    Two tiers, so that strangers cost no state. A sender is *trusted* once its owner says so
    (`trust`), which the daemon does only after the sender's handshake is verified; from then
    on the guard keeps a window per sender: the highest sequence number and a bitmap of the
    `window` numbers below it, as IPsec and DTLS do. Reordering within the window is fine, a
    repeat is `replay`, and a number below the window is `replay` because it can no longer be
    told apart from one. Every other sender gets the stateless check alone (the timestamp skew
    bound): the daemon accepts from strangers only handshake frames whose replay does no harm.

    Trusting a sender counts every sequence number up to the one that proved it as seen, so
    frames captured before a (re-)admission cannot be replayed after it. Nothing a stranger
    sends, whatever it puts in its timestamps, changes what the guard decides for anyone else:
    the guard remembers no timestamps at all.
    """

    def __init__(self, *, window: int = 1024, max_skew_us: int = 60_000_000, max_senders: int = 4096) -> None:
        for name, value in (("window", window), ("max_skew_us", max_skew_us), ("max_senders", max_senders)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"ReplayGuard {name} must be a positive integer, got {value!r}")
        self.window = window
        self.max_skew_us = max_skew_us
        self.max_senders = max_senders
        self._senders: OrderedDict[bytes, _SenderWindow] = OrderedDict()

    def __len__(self) -> int:
        return len(self._senders)

    def __contains__(self, sender: object) -> bool:
        return sender in self._senders

    def check_fresh(self, timestamp_us: int, now_us: int) -> None:
        """The stateless tier: raise ProtocolError (stale) if the timestamp is outside the skew bound."""
        if abs(timestamp_us - now_us) > self.max_skew_us:
            raise ProtocolError(
                Reason.STALE,
                f"timestamp {(timestamp_us - now_us) / 1e6:+.3f} s from "
                f"this node's clock (bound ±{self.max_skew_us / 1e6:g} s)",
            )

    def trust(self, sender: bytes, seq: int, *, unseen_from: int | None = None) -> None:
        """Keep a window for `sender` from now on; every sequence number up to `seq` counts as
        seen, except those from `unseen_from` to `seq - 1` (within the window): frames the
        owner received before trusting the sender and holds to check now, each accepted once.
        The least recently used window goes once more than `max_senders` are kept (its sender
        is a stranger again): the owner keeps the number of trusted senders below that."""
        seen = (1 << self.window) - 1
        if unseen_from is not None and unseen_from < seq:
            unseen = min(seq - unseen_from, self.window - 1)  # offsets 1..unseen: numbers below seq
            seen &= ~(((1 << unseen) - 1) << 1)
        self._senders.pop(sender, None)
        self._senders[sender] = _SenderWindow(highest=seq, seen=seen)
        while len(self._senders) > self.max_senders:
            self._senders.popitem(last=False)

    def forget(self, sender: bytes) -> None:
        """`sender` is a stranger again (evicted): its window is dropped."""
        self._senders.pop(sender, None)

    def admit(self, sender: bytes, seq: int, timestamp_us: int, now_us: int) -> bool:
        """Check one verified frame; raise ProtocolError (replay/stale) to refuse it. True if
        the sender is trusted (its window recorded `seq`), False if only the stateless check applied.

        Call it only for frames whose signature verified: recording unauthenticated numbers
        would let anyone burn an honest sender's window.
        """
        self.check_fresh(timestamp_us, now_us)
        state = self._senders.get(sender)
        if state is None:
            return False
        self._senders.move_to_end(sender)
        if seq > state.highest:
            shift = seq - state.highest
            state.seen = ((state.seen << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            state.highest = seq
            return True
        offset = state.highest - seq
        if offset >= self.window:
            raise ProtocolError(
                Reason.REPLAY, f"{node_id(sender)}: seq {seq} below the window (highest {state.highest})"
            )
        bit = 1 << offset
        if state.seen & bit:
            raise ProtocolError(Reason.REPLAY, f"{node_id(sender)}: seq {seq} already seen")
        state.seen |= bit
        return True


class SequenceExhausted(RuntimeError):
    """The reserved range is used up and no new reservation was persisted."""


class SequenceCounter:
    """Sequence numbers for one signing key that never repeat, across restarts too.

    A counter starts above both the last persisted reservation and the wall clock in
    microseconds: losing the state file is covered by the clock, a clock set back is covered
    by the state file. Numbers are only handed out below a reservation the owner has durably
    persisted, in two steps so that a failed write never lets the counter run ahead:

        counter = SequenceCounter(persisted=state.get("seq_reserved", 0), now_us=clock_us())
        limit = counter.propose_reservation()
        persist(limit)                    # durable write (fsync) ...
        counter.confirm_reservation(limit)  # ... before the numbers below it are used
        seq = counter.next()
        if counter.needs_reservation:     # half of the block is used: extend early
            ...same three lines...

    After a crash the next counter starts at the persisted reservation or later, so no number
    is reused; at most one block of numbers is skipped.
    """

    def __init__(self, *, persisted: int, now_us: int, block: int = 1 << 20) -> None:
        if type(persisted) is not int or persisted < 0 or type(now_us) is not int or now_us < 0:
            raise ValueError("persisted and now_us must be non-negative integers")
        if type(block) is not int or block <= 0:
            raise ValueError(f"block must be a positive integer, got {block!r}")
        self.block = block
        self._next = max(persisted, now_us)
        self.reserved_until = self._next  # only numbers below this may be used

    @property
    def needs_reservation(self) -> bool:
        return self.reserved_until - self._next <= self.block // 2

    def propose_reservation(self) -> int:
        """The reservation to persist next: one block beyond the next number."""
        return min(self._next + self.block, _U64_MAX + 1)

    def confirm_reservation(self, reserved_until: int) -> None:
        """Record that `reserved_until` is durably persisted; numbers below it may now be used."""
        if type(reserved_until) is not int or reserved_until > _U64_MAX + 1:
            raise ValueError(f"invalid reservation {reserved_until!r}")
        self.reserved_until = max(self.reserved_until, reserved_until)

    def next(self) -> int:
        if self._next >= self.reserved_until:
            raise SequenceExhausted(
                f"sequence {self._next} is not covered by a persisted "
                f"reservation (reserved until {self.reserved_until})"
            )
        seq = self._next
        self._next += 1
        return seq
